"""Snapshot count: the time to create snapshot number 1, 1,000, 10,000 and
100,000 of one volume, and `grove list` at each count. Snapshots are
created through the engine's API (grove-bench snapshots), which times each
one; at each checkpoint the harness also times `grove snapshot` and
`grove list --json` as processes (opening the pool included). Stops early,
saying so, when the profile's time budget runs out."""

import statistics
import time

LIST_REPEAT = 3


def run(ctx):
    p = ctx.profile
    work = ctx.dir("snapcount")
    pool = work / "pool"
    ctx.grove.init(pool)
    ctx.grove.cli(pool, "create", "v", "--size", "1G")
    started = time.monotonic()
    rows = []
    stopped = None
    for checkpoint in p.snapcount_checkpoints:
        left_s = p.snapcount_budget_s - (time.monotonic() - started)
        if left_s <= 0:
            stopped = f"stopped before {checkpoint:,}: its {p.snapcount_budget_s:.0f} s budget was spent"
            break
        ctx.log(f"snapcount: {checkpoint}")
        last = checkpoint + p.snapcount_window - 1
        made = ctx.grove.bench_json("snapshots", "--pool", pool, "--volume", "v",
                                    "--to", last, "--report-from", checkpoint,
                                    "--window", p.snapcount_window,
                                    "--max-seconds", f"{left_s:.1f}",
                                    timeout=left_s + 600)
        if made["stopped"] or str(checkpoint) not in made["snapshot_ms"]:
            # The budget ran out on the way: report the last snapshots made.
            number = made["count"]
            window = made["last_ms"]
            stopped = (f"stopped at {number:,} snapshots on the way to {checkpoint:,}: "
                       f"its {p.snapcount_budget_s:.0f} s budget was spent")
        else:
            number = checkpoint
            window = list(made["snapshot_ms"].values())
        list_s = ctx.grove.timed(pool, "list", "--json", repeat=LIST_REPEAT)
        cli_snapshot_s = ctx.grove.timed(pool, "snapshot", "v", f"cli-{checkpoint}")
        rows.append({
            "snapshot_number": number,
            "snapshot_ms": made["snapshot_ms"].get(str(number), window[-1]),
            "window_median_ms": statistics.median(window),
            "window": len(window),
            "open_ms": made["open_ms"],
            "volumes": made["count"] + 1 + len(rows),  # with v and earlier cli-N snapshots
            "list_s": list_s,
            "cli_snapshot_s": cli_snapshot_s,
        })
        if stopped:
            break
    first = rows[0]
    for row in rows:
        row["window_vs_first"] = row["window_median_ms"] / first["window_median_ms"]
    return {
        "rows": rows,
        "stopped": stopped,
        "metadata": ctx.grove.metadata(pool, f"snapcount ({rows[-1]['snapshot_number']} snapshots)"),
    }
