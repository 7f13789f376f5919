"""One module per workload of the suite; each has run(ctx) -> dict."""
