"""bench/results/latest.md: every figure next to its peer from the same
run, each row with its cache mode, then the targets met or not."""

import rados_report
from targets import list_cases

MIB = 1 << 20
GIB = 1 << 30


def _numeric(cell):
    text = str(cell).replace(",", "").replace("%", "").replace(" MiB", "").split(" (")[0]
    try:
        float(text)
        return True
    except ValueError:
        return text == "–"


def _table(header, rows):
    """A markdown table; columns of numbers are aligned right."""
    align = [":---" if not all(_numeric(row[i]) for row in rows) else "---:"
             for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _f(value, digits=2):
    return "–" if value is None else f"{value:.{digits}f}"


def _n(value):
    return "–" if value is None else f"{value:,.0f}"


def targets_section(checks):
    rows = [[c["target"], _f(c["value"], 3) if isinstance(c["value"], float) else "–",
             c["goal"], "**met**" if c["met"] else "not met", c["detail"], c["blocker"] or ""]
            for c in checks]
    return ["## Targets", ""] + _table(
        ["target", "value", "goal", "met?", "figures", "what blocks it"], rows)


def servers_section(s, p):
    by = {(r["job"], r["target"]): r for r in s["rows"]}
    rows = []
    for r in s["rows"]:
        # The limit in the row's own cache mode (runs before the buffered
        # limit existed have only the direct one).
        limit_row = by.get((r["job"], f"plain-{r['cache']}"), by[(r["job"], "plain-direct")])
        limit = limit_row["iops"]
        nbdkit = by[(r["job"], "nbdkit-file")]["iops"]
        same_cache_qemu = by[(r["job"], f"qemu-nbd-{r['cache']}")]["iops"]
        rows.append([r["job"], r["label"], r["cache"], _n(r["iops"]), _f(r["mib_s"], 1),
                     _f(r["iops"] / limit), _f(r["iops"] / nbdkit),
                     _f(r["iops"] / same_cache_qemu)])
    return [f"## The limit and the NBD servers", "",
            f"fio, {p['numjobs']} jobs x iodepth {p['iodepth']}, {p['runtime_s']} s a job, "
            f"{s['rounds']} round(s) taking turns (median), image "
            f"{s['image_bytes'] / MIB:.0f} MiB of random data; NBD over a unix socket "
            "with fio's nbd engine.", ""] + _table(
        ["job", "target", "cache", "IOPS", "MiB/s", "/ limit same cache", "/ nbdkit",
         "/ qemu-nbd same cache"], rows)


def depth_section(d, p):
    rows = []
    for r in d["rows"]:
        ratio = (r["grove_iops"] / r["qcow2_iops"]) if r["qcow2_iops"] else None
        qcow2 = "failed" if r.get("qcow2_error") else _n(r["qcow2_iops"])
        rows.append([r["depth"], r["cache"], _n(r["grove_iops"]), _f(r["grove_vs_depth0"]),
                     qcow2, _f(r["qcow2_vs_depth0"]), _f(ratio), _f(r["qcow2_ready_s"], 1)])
    failed = [r for r in d["rows"] if r.get("qcow2_error")]
    return ["## Snapshot depth", "",
            f"Random 4K reads of the tip of a chain of clones ({d['writes_per_level']} "
            f"random 4K writes at each level, over {d['image_bytes'] / MIB:.0f} MiB of data) "
            f"through a fresh `grove serve` (median of {d.get('rounds', 1)} round(s)), against qemu-nbd on the top of a qcow2 chain "
            f"with the same writes (whole 64K clusters), up to depth {d['qcow2_max_depth']}.", ""
            ] + _table(["depth", "cache", "grove IOPS", "grove / depth 0", "qcow2 IOPS",
                        "qcow2 / depth 0", "grove / qcow2", "qemu-nbd start s"], rows) + [
            f"\nqcow2 at depth {r['depth']} failed: `{r['qcow2_error']}`." for r in failed]


def nsnaps_section(n, p):
    host = "host_ratio" in n["pairs"][0]

    def host_cells(x, ratio_key):
        if not host:
            return []
        return [_n(x["host_overwrite_iops"]), _n(x["host_first_write_iops"]),
                _f(x[ratio_key])]

    rows = [[x["snapshot"], "buffered", _n(x["no_snapshot_iops"]),
             _n(x["after_snapshot_iops"]), _f(x["ratio"]),
             "yes" if x["first_writes_only"] else "no"] + host_cells(x, "host_ratio")
            for x in n["pairs"]]
    rows.append(["median", "buffered", _n(n["no_snapshot_iops"]),
                 _n(n["after_snapshot_iops"]), _f(n["ratio_median"]), ""]
                + host_cells(n, "host_ratio_median"))
    header = ["snapshot", "cache", "no snapshot IOPS", "after snapshot IOPS", "ratio",
              "first writes only"]
    text = ("Random 4K writes for the same time into a volume right after a snapshot of "
            "it, and into a volume with no snapshot (same data, written whole), in turns "
            f"in one `grove serve`; {n['image_bytes'] / MIB:.0f} MiB volumes; each job has its "
            "own quarter and writes no block twice.")
    if host:
        header += ["nbdkit overwrite IOPS", "nbdkit first-write IOPS", "nbdkit ratio"]
        text += (" In turns with them, the same writes through nbdkit's file plugin: "
                 "overwrites of a written raw file, and first writes into a sparse raw "
                 "file never written before. A write after a snapshot lands in a new "
                 "block, a page of the store file the host does not cache yet, so the "
                 "nbdkit ratio is what the host's file system charges for that, "
                 "whatever grove does. Every run starts with no dirty pages (sync).")
    return ["## Write after snapshot (ddsnap's nsnaps)", "", text, ""] + _table(header, rows)


def memory_section(m, p):
    rows = []
    for r in m["rows"]:
        cache = "–" if r["cache_bytes"] is None else f"{r['cache_bytes'] / MIB:.0f} MiB"
        over = "–" if r["cache_bytes"] is None else f"{(r['peak_hwm_bytes'] - r['cache_bytes']) / MIB:.0f} MiB"
        rows.append([r["cache"], cache, f"{r['idle_hwm_bytes'] / MIB:.0f} MiB",
                     f"{r['peak_hwm_bytes'] / MIB:.0f} MiB", over, _n(r["iops"])])
    return ["## Memory", "",
            f"Peak RSS (VmHWM) of `grove serve` over a {m['volume_gib']} GiB volume (a 4K "
            f"block every {p['memory_stride_kib']} KiB) with {m['snapshots']} snapshots, "
            f"{p['memory_writes_between']} random 4K writes after each, under random 4K reads of "
            f"{', '.join(m['exports_read'])} at once. Cache setting: {m['cache_setting']}.", ""
            ] + _table(["cache", "cache size", "VmHWM idle", "VmHWM peak", "peak - cache",
                        "read IOPS"], rows)


def snapcount_section(s, p):
    rows = [[f"{r['snapshot_number']:,}", _f(r["snapshot_ms"], 3),
             f"{_f(r['window_median_ms'], 3)} (of {r['window']})", _f(r["window_vs_first"]),
             _f(r["open_ms"], 1), _f(r["cli_snapshot_s"], 3), _f(r["list_s"], 3),
             f"{r['volumes']:,}"] for r in s["rows"]]
    lines = ["## Snapshot count", "",
             "Snapshots of one 1 GiB volume, one 4K write between two, through the "
             "engine's API (timed there); `grove snapshot` and `grove list --json` timed as "
             "processes, opening the pool included.", ""] + _table(
        ["snapshot #", "that one ms", "median ms", "/ snapshot 1", "open ms (API)",
         "`grove snapshot` s", "`grove list` s", "volumes"], rows)
    if s["stopped"]:
        lines += ["", f"The run {s['stopped']}."]
    return lines


def metadata_section(results):
    rows = []
    for name, w in results["workloads"].items():
        m = w.get("metadata") if isinstance(w, dict) else None
        if not m:
            continue
        rows.append([m["workload"], f"{m['metadata_bytes'] / MIB:.2f}",
                     f"{m['used_bytes'] / MIB:.1f}", f"{m['referenced_bytes'] / MIB:.1f}",
                     f"{m['volume_count']:,}",
                     "–" if m["metadata_over_data"] is None else f"{m['metadata_over_data'] * 100:.3f}%"])
    return ["## Metadata over data", "",
            "From `grove info --json` after each workload: data is `referenced_bytes` "
            "(what live volumes map, shared data once).", ""] + _table(
        ["after", "metadata MiB", "used MiB", "referenced MiB", "volumes",
         "metadata / data"], rows)


def replication_section(r, p):
    t = r["transfers"]
    rows = []
    for x in t["rows"]:
        rows.append([x["transfer"], x["system"], f"{x['data_bytes'] / MIB:.2f}",
                     _f(x["pipe_s"], 3), _f(x["durable_s"], 3), _f(x["pipe_mb_s"], 1),
                     _f(x["mb_s"], 1),
                     "–" if "durable_s_range" not in x else
                     f"{x['durable_s_range'][0]:.3f}–{x['durable_s_range'][1]:.3f}",
                     _f(x["send_alone_s"], 3), _n(x["stream_bytes"]), x["verified"]])
    ratios = t.get("grove_over_btrfs", {})
    lines = ["## Replication", "",
             f"`grove send | grove receive` between two pools against `btrfs send | btrfs "
             f"receive` between two btrfs file systems (sparse files on loop devices), all on "
             f"the same disk: {t['data_bytes'] / MIB:.0f} MiB of random data sent full, then "
             f"{t['changed_blocks']:,} random 4 KiB blocks (1%) rewritten (pwrite for btrfs) "
             "and sent incrementally. Cache: " + r["cache"] + ". MB/s are 10^6 bytes of "
             "data (not stream) per second; \"durable\" adds a `sync` after the pipe "
             "(btrfs receive does not sync). The sender alone is timed into `wc -c`. "
             f"Medians of {t.get('rounds', 1)} round(s) taking turns (order flipped "
             "each round), each into a fresh receiving pool and file system.",
             ""] + _table(["transfer", "system", "data MiB", "pipe s", "durable s",
                           "pipe MB/s", "durable MB/s", "durable s min–max",
                           "sender alone s", "stream bytes",
                           "verified"], rows)
    if r["btrfs"] != "ok":
        lines += ["", f"No btrfs peer in this run: {r['btrfs']}."]
    if ratios:
        lines += ["", "grove / btrfs (MB/s): " + ", ".join(
            f"{k.replace('_pipe', ' (pipe only)')} {v:.2f}" for k, v in ratios.items()) + "."]
    s = r["sparse"]
    srows = [["grove", _n(s["grove_stream_bytes"]), f"{(s['grove_over_data'] - 1) * 100:.3f}%",
              _f(s["grove_send_alone_s"], 2), _f(s["durable_s"], 2), _f(s["mb_s"], 1),
              s["verified"]]]
    if "btrfs_stream_bytes" in s:
        srows.append(["btrfs", _n(s["btrfs_stream_bytes"]),
                      f"{(s['btrfs_over_data'] - 1) * 100:.3f}%",
                      _f(s["btrfs_send_alone_s"], 2), "–", "–", "bytes counted only"])
    lines += ["", f"A {s['volume_bytes'] / GIB:,.0f} GiB volume holding "
              f"{s['data_bytes'] / MIB:,.0f} MiB in {s['extents']} scattered extents "
              "(btrfs: the same content as a sparse file, from `grove export`):", ""]
    lines += _table(["system", "stream bytes", "over data", "sender alone s",
                     "send → receive s (durable)", "MB/s", "verified"], srows)
    n = r["snapshots"]
    lines += ["", f"{n['snapshots']:,} snapshots with no change between them "
              f"(over {n['data_bytes'] / MIB:.0f} MiB of data) as one stream "
              f"(`send -I v@0 v@{n['snapshots']}`, {n['stream_bytes']:,} bytes, through a "
              f"file) into a pool holding v@0: sender {n['send_s']:.3f} s, receive "
              f"{n['receive_s']:.3f} s, each a whole `grove` process; {n['verified']}."]
    return lines


def list_lines(case):
    """`grove list`, and the admin commands, on one pool size."""
    window = case.get("window_s")
    lines = ["", "`grove list --json` through the control socket of a served pool while "
             "one fio client reads random 4K blocks (1 job, iodepth 1), against the same "
             "span of a quiet " + (f"{window:g} s " if window else "") + "window:", ""]
    lrows = []
    for which in ("list_before", "list"):
        x = case.get(which)
        if not x:
            continue
        lrows.append(["before" if which == "list_before" else "this grove",
                      f"{x['volumes']:,}", _f(x["list_s"], 3),
                      _f(x["quiet_span"]["lat_max_ms"], 2), _f(x["stall_ms"], 2),
                      _n(x["quiet_span"]["iops"]), _n(x["during_span"]["iops"]),
                      "yes" if x["covered"] else "no", f"`{x['grove']}`"])
    lines += _table(["grove", "volumes", "list s", "worst read ms quiet",
                     "worst read ms during list", "read IOPS quiet", "read IOPS during",
                     "window covers", "binary"], lrows)
    admin = case.get("admin")
    if admin:
        lines += ["", f"Admin commands through the control socket of the same pool "
                  f"({admin['volumes']:,} volumes), one after another in one read window "
                  "like the list's, against the same spans of a quiet window (the worst "
                  "read of fio's 100 ms rows covering each command):", ""]
        arows = [[f"`grove {' '.join(c['args'])}`", _f(c["s"], 3),
                  _f(c["quiet_span"]["lat_max_ms"], 2), _f(c["stall_ms"], 2),
                  "yes" if c["covered"] else "no"] for c in admin["commands"]]
        lines += _table(["command", "s", "worst read ms quiet", "worst read ms during",
                         "window covers"], arows)
    return lines


def retention_section(r, p):
    rows = []
    for x in r["prune"]:
        label = f"{x['snapshots']:,}"
        if p.get("retention_rounds", 1) > 1:
            label += f" (round {x.get('round', 0) + 1})"
        load = (f"{x['numjobs']} x {x['iodepth']}, {x['window_s']:.1f} s" if "load" in x
                else f"{p['numjobs']} x {p['iodepth']}, {r['window_s']:.1f} s")
        rows.append([label, load, _f(x["prune_s"], 3), _f(x["reclaim_s"], 3),
                     _n(x["quiet"]["iops"]), _n(x["during"]["iops"]),
                     _f(x["iops_ratio_window"]),
                     _n(x["quiet_span"]["iops"]), _n(x["during_span"]["iops"]),
                     _f(x["iops_ratio_span"]),
                     _n(x.get("steady_outside", {}).get("iops")),
                     _f(x.get("iops_ratio_same_run")),
                     _f(x["quiet_span"]["lat_max_ms"], 1), _f(x["during_span"]["lat_max_ms"], 1),
                     _f(x["quiet"]["lat_max_ms"], 1), _f(x["during"]["lat_max_ms"], 1),
                     "yes" if x["covered"] else "no"])
    lines = ["## Retention", "",
             "Volumes with N hourly-ranked snapshots an hour apart (a 4 KiB write after "
             "each) and a policy keeping the newest 2, in a pool served by `grove serve` "
             "(its scheduler kept idle). While fio writes random 4K blocks into another "
             "volume of the pool (buffered; \"fio\": jobs x iodepth, and the window), "
             "`grove prune` (metadata work) and then "
             f"`grove gc --wait` (reclaim) run through the control socket, starting "
             f"{p.get('retention_prune_lead_s', p['retention_lead_s'])} s in "
             f"({p.get('retention_probe_lead_s', '-')} s with one request in flight, the "
             "latency probe, whose window is sized from the full load's spans); each is a "
             "whole `grove` process, timed. The "
             "same window runs just before with no pruning. \"span\" is the stretch "
             "prune and reclaim took, measured in both windows from fio's 100 ms logs; "
             "\"same run\" is the pruned window's own pace outside that span (past its "
             "first 2 s), before and after; "
             "latencies are the worst single request's (completion latency, from fio's histograms).", ""]
    lines += _table(["snapshots", "fio", "prune s", "reclaim s", "IOPS quiet window",
                     "IOPS pruned window", "ratio", "IOPS quiet span", "IOPS pruned span",
                     "ratio (span)", "IOPS same run outside", "ratio (same run)",
                     "worst ms quiet span", "worst ms pruned span",
                     "worst ms quiet window", "worst ms pruned window",
                     "window covers"], rows)
    def phase(x, name):
        f = x["phases"][name]
        text = f"{name} {_n(f['iops'])} IOPS, worst {_f(f['lat_max_ms'], 1)} ms"
        if f.get("iops_ratio") is not None:
            text += (f" ({_f(f['iops_ratio'])} of the quiet span's "
                     f"{_n(f['quiet_iops'])}, worst {_f(f['quiet_lat_max_ms'], 1)} ms)")
        return text
    lines += ["", "Each phase apart (pruned window): " + "; ".join(
        f"{x['snapshots']:,} ({x.get('numjobs', p['numjobs'])} x "
        f"{x.get('iodepth', p['iodepth'])}): {phase(x, 'prune')}; {phase(x, 'reclaim')}"
        for x in r["prune"]) + "."]
    for case in list_cases(r):
        lines += list_lines(case)
    return lines


def branches_section(b, p):
    rows = []
    for r in b["rows"]:
        if "iops" not in r:
            rows.append([r["label"], r["job"], "–", "–", "–", "–", r.get("missing") or ""])
            continue
        rows.append([r["label"], r["job"], _n(r["iops"]), _f(r["mib_s"], 1),
                     _f(r.get("over_single_file")), _f(r.get("over_btrfs")),
                     r.get("btrfs_peer", "")])
    lines = ["## Pools over branches", "",
             f"The same {b['image_bytes'] // MIB} MiB of random data on each target; fio "
             f"({p['numjobs']} jobs x iodepth {p['iodepth']}, {p['runtime_s']:g} s, median of "
             f"{b['rounds']} round(s) taking turns): grove through `grove serve` (nbd engine, writes ending with a flush), "
             "btrfs on a file (libaio, buffered, end_fsync for writes). Every branch "
             f"directory and loop device image is on the work directory's disk. Page cache: "
             f"{b['cache']}.", ""]
    lines += _table(["target", "job", "IOPS", "MiB/s", "/ single-file pool", "/ btrfs peer",
                     "btrfs peer"], rows)
    r = b["rebuild"]
    lines += ["", f"Rebuild of RAIF5's branch b1 through the control socket of the served "
              f"pool, under random 4K reads: {r['bytes_written'] / MIB:.0f} MiB written in "
              f"{r['rebuild_s']:.2f} s ({r['rebuild_mib_s']:.1f} MiB/s), "
              f"{_f(r['rebuild_over_seq_write'])} of the disk's own sequential write speed "
              f"({r['disk_seq_write_mib_s']:.1f} MiB/s, fio 1 MiB direct writes of as many "
              f"bytes). Foreground read IOPS during the rebuild: "
              f"{_n(r['during_span']['iops'])} against {_n(r['quiet_span']['iops'])} in the "
              f"same span without it ({_f(r['iops_ratio_span'])}); worst read "
              f"{_f(r['during_span']['lat_max_ms'], 1)} ms against "
              f"{_f(r['quiet_span']['lat_max_ms'], 1)} ms."
              + ("" if r["covered"] else " The rebuild outlasted the fio window.")]
    return lines


def archive_scale_section(a, p):
    made = a["made"]
    rows = [[f"`grove archive {r['command']}`", _f(r["s"], 1),
             f"{r['peak_rss_bytes'] / MIB:.0f} MiB", "yes" if r["within_bound"] else "NO"]
            for r in a["commands"]]
    r = a["reads"]
    rows.append([f"`grove serve`: random 4K reads ({_n(r['random_4k_iops'])} IOPS), then "
                 f"nbdcopy of the mapped data ({r['copy_mapped_s']:.1f} s)",
                 _f(r["random_s"] + r["copy_mapped_s"], 1),
                 f"{r['peak_hwm_bytes'] / MIB:.0f} MiB", "yes" if r["within_bound"] else "NO"])
    return ["## Archive at scale", "",
            f"An archive of {a['snapshots']:,} daily snapshots of a "
            f"{a['volume_bytes'] / GIB:g} GiB volume, each rewriting {a['changes']} random "
            f"4 KiB blocks ({made['pack_bytes'] / MIB:.0f} MiB of packs, "
            f"{made['index_bytes'] / MIB:.0f} MiB of index, a "
            f"{made['catalog_bytes'] / MIB:.1f} MiB catalog), made object by object by "
            f"`grove-bench archive-scale` in {a['make_s']:.0f} s. Bound: the read cache "
            f"({a['cache']}) plus 64 MiB = {a['bound_bytes'] / MIB:.0f} MiB. Expiry dropped "
            f"{a['expired']:,} snapshots and kept {a['kept']}, copying "
            f"{a['expire_bytes_copied'] / MIB:.0f} MiB the kept ones still use.", ""
            ] + _table(["command", "s", "peak RSS", "within bound"], rows)


SECTIONS = {
    "servers": servers_section,
    "depth": depth_section,
    "nsnaps": nsnaps_section,
    "memory": memory_section,
    "snapcount": snapcount_section,
    "replication": replication_section,
    "retention": retention_section,
    "branches": branches_section,
    "archive_scale": archive_scale_section,
    "rados": lambda r, p: rados_report.section(r, p, _table),
}


def render(results, checks, plots):
    p = results["profile"]
    m = results["machine"]
    lines = [f"# grove benchmarks: {results['date']} ({p['name']} run)", "",
             f"`{results['command']}` on {m['cpus']} CPUs ({m['cpu']}), kernel {m['kernel']}, "
             f"grove {m['grove_commit']}; {m['fio']}, {m['qemu_nbd']}, {m['nbdkit']}. "
             f"The whole run took {results['elapsed_s'] / 60:.1f} min. Raw figures: "
             f"`{results['json_name']}`. Every ratio compares figures from this one run.", ""]
    for rerun in results.get("reruns", []):
        lines += [f"The {rerun['workload']} workload was run again alone at {rerun['date']} "
                  f"({rerun['why']}); its figures and their peers come from that run.", ""]
    lines += targets_section(checks) + [""]
    for name, section in SECTIONS.items():
        w = results["workloads"].get(name)
        if w is None:
            continue
        if "error" in w:
            lines += [f"## {name}", "", f"Failed: `{w['error'].splitlines()[0][:300]}`", ""]
            continue
        lines += section(w, p) + [""]
    lines += metadata_section(results) + [""]
    if plots:
        lines += ["## Plots", ""] + [f"![{title}]({path})" for title, path in plots] + [""]
    return "\n".join(lines)
