"""The targets of issue 15, as ratios from one run, each met or not, with
what blocks it when it is not met."""

MIB = 1 << 20
RSS_SLACK_BYTES = 64 * MIB
METADATA_MAX_RATIO = 0.002


def _target(name, value, goal, met, detail, blocker):
    return {"target": name, "value": value, "goal": goal, "met": met,
            "detail": detail, "blocker": None if met else blocker}


def servers_target(servers):
    by = {(r["job"], r["target"]): r for r in servers["rows"]}
    jobs = list(dict.fromkeys(r["job"] for r in servers["rows"]))
    ratios = {j: by[(j, "grove")]["iops"] / by[(j, "nbdkit-file")]["iops"] for j in jobs}
    worst = min(ratios, key=ratios.get)
    return _target(
        "grove serve >= nbdkit file plugin, every job (both buffered)",
        ratios[worst], ">= 1.0 on each", all(v >= 1.0 for v in ratios.values()),
        ", ".join(f"{j} {v:.2f}" for j, v in ratios.items()),
        f"{worst} is slowest: nbdkit passes a raw file straight through with no "
        "metadata; grove serializes lookups, allocating writes and commits under "
        "one pool mutex (issue 15 point 2)")


def depth_target(depth):
    rows = depth["rows"]
    deepest = rows[-1]
    ratio = deepest["grove_vs_depth0"]
    return _target(
        f"random 4K read IOPS, depth {deepest['depth']} / depth 0",
        ratio, ">= 0.9", ratio >= 0.9,
        f"{deepest['grove_iops']:.0f} vs {rows[0]['grove_iops']:.0f} IOPS",
        "a lookup does not depend on depth, so what differs is what the deep "
        "volume's server caches and shares: metadata nodes of a chain of "
        "clones are distinct copies, all kept in memory (issue 15 point 1)")


def nsnaps_target(nsnaps):
    ratio = nsnaps["ratio_median"]
    return _target(
        "first random 4K write after a snapshot / no snapshot",
        ratio, ">= 0.5", ratio >= 0.5,
        f"median of {len(nsnaps['pairs'])} pairs, min {nsnaps['ratio_min']:.2f}",
        "an allocating (copy-on-write) write takes the pool-wide lock for its "
        "data I/O and commit, while an overwrite runs in parallel "
        "(issue 15 point 2)")


def memory_target(memory):
    rows = [r for r in memory["rows"] if r["cache_bytes"] is not None]
    if not rows:
        peak = max(r["peak_hwm_bytes"] for r in memory["rows"])
        return _target("peak RSS <= cache size + 64 MiB", None, "<= cache + 64 MiB",
                       False, f"peak VmHWM {peak / MIB:.0f} MiB; no cache setting yet",
                       "no cache setting yet: every metadata node read stays in "
                       "memory for good (issue 15 point 1)")
    worst = max(rows, key=lambda r: r["peak_hwm_bytes"] - r["cache_bytes"])
    over = worst["peak_hwm_bytes"] - worst["cache_bytes"]
    return _target("peak RSS <= cache size + 64 MiB", over / MIB, "<= 64 MiB over",
                   all(r["peak_hwm_bytes"] <= r["cache_bytes"] + RSS_SLACK_BYTES for r in rows),
                   "; ".join(f"{r['cache']} cache {r['cache_bytes'] / MIB:.0f} MiB: "
                             f"{r['peak_hwm_bytes'] / MIB:.0f} MiB" for r in rows),
                   f"at the {worst['cache']} cache the server holds {over / MIB:.0f} MiB "
                   "beyond its cache: memory outside the metadata cache "
                   "(allocation maps, volume table, buffers) grows with the pool")


def metadata_target(servers):
    m = servers["metadata"]
    ratio = m["metadata_over_data"]
    return _target("metadata / data, one fully written volume", ratio, "<= 0.002",
                   ratio is not None and ratio <= METADATA_MAX_RATIO,
                   f"{m['metadata_bytes'] / MIB:.2f} MiB over {m['referenced_bytes'] / MIB:.0f} MiB",
                   "metadata_bytes counts the journal, allocation maps and volume "
                   "table besides the radix nodes; at this volume size those fixed "
                   "costs dominate")


def evaluate(results):
    checks = []
    w = results["workloads"]
    if "servers" in w:
        checks.append(servers_target(w["servers"]))
    if "depth" in w:
        checks.append(depth_target(w["depth"]))
    if "nsnaps" in w:
        checks.append(nsnaps_target(w["nsnaps"]))
    if "memory" in w:
        checks.append(memory_target(w["memory"]))
    if "servers" in w:
        checks.append(metadata_target(w["servers"]))
    return checks
