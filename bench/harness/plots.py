"""PNG plots: IOPS against snapshot depth for grove and qcow2, the servers'
IOPS as a share of the limit, and the target ratios. matplotlib comes from
the distribution (python3-matplotlib); without it the run says so and
writes no plots."""

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # the smoke test runs wherever python3 is
    plt = None


def available():
    return plt is not None


def depth_plot(depth, path):
    rows = depth["rows"]
    # Depth 0 on a log axis: place it at 0.5 and label it.
    xs = [max(r["depth"], 0.5) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(xs, [r["grove_iops"] for r in rows], "o-", label="grove serve (clone chain)")
    q = [(x, r["qcow2_iops"]) for x, r in zip(xs, rows) if r["qcow2_iops"] is not None]
    if q:
        ax.plot([x for x, _ in q], [y for _, y in q], "s-", label="qemu-nbd (qcow2 backing chain)")
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(r["depth"]) for r in rows])
    ax.set_xlabel("snapshot depth")
    ax.set_ylabel("random 4K read IOPS")
    ax.set_ylim(bottom=0)
    ax.set_title("Random 4K reads against snapshot depth (buffered, fresh server each)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def servers_plot(servers, path):
    rows = servers["rows"]
    jobs = list(dict.fromkeys(r["job"] for r in rows))
    targets = list(dict.fromkeys(r["target"] for r in rows))
    by = {(r["job"], r["target"]): r for r in rows}
    width = 0.8 / len(targets)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, t in enumerate(targets):
        values = [by[(j, t)]["iops"] / by[(j, "plain-direct")]["iops"] for j in jobs]
        label = f"{by[(jobs[0], t)]['label']} ({by[(jobs[0], t)]['cache']})"
        ax.bar([k + i * width for k in range(len(jobs))], values, width, label=label)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(jobs))])
    ax.set_xticklabels(jobs)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("IOPS / plain file with direct I/O")
    ax.set_title("Servers against the limit (same fio jobs, one run)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def targets_plot(checks, path):
    goals = {">= 0.9": 0.9, ">= 0.5": 0.5, ">= 1.0 on each": 1.0, "<= 2.0": 2.0}
    ratio_checks = [c for c in checks if isinstance(c["value"], float) and c["goal"] in goals]
    if not ratio_checks:
        return False
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [c.get("short", c["target"][:30]) for c in ratio_checks]
    colors = ["tab:green" if c["met"] else "tab:red" for c in ratio_checks]
    ax.barh(names, [c["value"] for c in ratio_checks], color=colors)
    for k, c in enumerate(ratio_checks):
        ax.text(c["value"], k, f" {c['value']:.2f}", va="center", fontsize=8)
    for k, c in enumerate(ratio_checks):
        goal = goals.get(c["goal"])
        if goal is not None:
            ax.plot([goal, goal], [k - 0.4, k + 0.4], "k--")
    ax.set_xlabel("ratio (dashed: target; green met, red not)")
    ax.set_title("Overheads as ratios to the peer in the same run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_all(results, checks, out, stem):
    """Writes the plots this run has data for; returns (title, file name)."""
    if plt is None:
        return []
    done = []
    w = results["workloads"]
    if "depth" in w and "rows" in w["depth"]:
        depth_plot(w["depth"], out / f"{stem}-depth.png")
        done.append(("IOPS against snapshot depth", f"{stem}-depth.png"))
    if "servers" in w and "rows" in w["servers"]:
        servers_plot(w["servers"], out / f"{stem}-servers.png")
        done.append(("servers against the limit", f"{stem}-servers.png"))
    if targets_plot(checks, out / f"{stem}-targets.png"):
        done.append(("target ratios", f"{stem}-targets.png"))
    return done
