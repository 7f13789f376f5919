"""The rados workload's section of latest.md and its targets (issue 38
point 7): grove on RADOS against RBD and `rados bench`, from one run."""

MIB = 1 << 20


def _f(value, digits=2):
    return "–" if value is None else f"{value:.{digits}f}"


def _n(value):
    return "–" if value is None else f"{value:,.0f}"


NONE = {"iops": None, "mib_s": None, "before_iops": None, "after_iops": None, "ratio": None,
        "quiet_iops": None, "during_iops": None, "rm_s": None, "reclaim_s": None,
        "seconds": None}


def _ratio(a, b):
    return a / b if a is not None and b else None


def section(r, p, table):
    g, b = r.get("grove", {}), r.get("rbd", {})
    rows = []
    for job in ("seq-read", "seq-write", "rand-read", "rand-write"):
        gj, bj = g.get("jobs", {}).get(job, NONE), b.get("jobs", {}).get(job, NONE)
        rows.append([job, _n(gj["iops"]), _f(gj["mib_s"], 1), _n(bj["iops"]),
                     _f(bj["mib_s"], 1), _f(_ratio(gj["iops"], bj["iops"]))])
    limit = r["rados_bench"]
    lines = ["## grove on RADOS against RBD", "",
             f"One Ceph cluster (pool {r['pool']}), images of {r['image_bytes'] / MIB:.0f} MiB "
             f"in {r['object_bytes'] / MIB:.0f} MiB objects, written whole first; "
             f"fio {r['runtime_s']} s a job. grove: {r['settings']['grove']}. RBD: "
             f"{r['settings']['rbd']}. OSD rotational: {r['settings']['osd_rotational']} "
             f"(HDD defaults; {r['settings']['osd_snap_trim_sleep_hdd_default']} s "
             "snap-trim sleep, 0 while snapshots are removed).", ""]
    lines += table(["job", "grove IOPS", "grove MiB/s", "RBD IOPS", "RBD MiB/s",
                    "grove / RBD"], rows)
    lines += ["", "`rados bench` (" + r["settings"]["rados_bench"] + "): " + ", ".join(
        f"{k.replace('_', ' ')} {_n(v['iops'])} IOPS / {_f(v['mib_s'], 1)} MiB/s"
        for k, v in limit.items()) + ".", ""]
    rows = []
    for name, side in (("grove", g), ("RBD", b)):
        fw, rm, to = (side.get(k, NONE) for k in ("first_write", "removal", "takeover"))
        rows.append([name, _n(fw["before_iops"]), _n(fw["after_iops"]), _f(fw["ratio"]),
                     _n(rm["quiet_iops"]), _n(rm["during_iops"]), _f(rm["ratio"]),
                     f"{_f(rm['rm_s'], 1)} + {_f(rm['reclaim_s'], 1)}",
                     _f(to["seconds"], 1)])
    lines += table(["", "4K writes before snapshot", "first writes after", "ratio",
                    "IOPS before removal", "during removal", "ratio",
                    f"removing {p.get('rados_snapshots')} (rm + reclaim/trim, s)",
                    "takeover s"], rows)
    for name, side in (("grove", g), ("RBD", b)):
        if "error" in side:
            lines += ["", f"{name} failed: `{side['error'].splitlines()[0][:300]}`"]
    return lines


def targets(r, make_target):
    g, b = r.get("grove", {}), r.get("rbd", {})
    if any(k not in side for side in (g, b) for k in ("jobs", "removal", "takeover")):
        return []
    ratios = {}
    for job in g["jobs"]:
        ratios[f"{job} IOPS"] = g["jobs"][job]["iops"] / b["jobs"][job]["iops"]
    worst = min(ratios, key=ratios.get)
    removal = g["removal"]["ratio"] or 0.0
    takeover = g["takeover"]["seconds"]
    return [
        make_target("grove on RADOS >= RBD (cache off), every job", f"grove / RBD ({worst})",
                    ratios[worst], ">= 1.0 on each", all(v >= 1.0 for v in ratios.values()),
                    ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()),
                    "see the rados section: per-request RADOS round trips"),
        make_target("foreground 4K writes while removing snapshots / without (RADOS)",
                    "removal IOPS ratio", removal, ">= 0.9", removal >= 0.9,
                    f"grove {removal:.2f}, RBD {_f(b['removal']['ratio'])}",
                    "removal and reclaim commits share the device with the clients"),
        make_target("takeover from kill -9 to the first write served (RADOS)", "takeover s",
                    takeover, "< 10 s", takeover < 10.0,
                    f"grove {takeover:.1f} s, RBD {_f(b['takeover']['seconds'], 1)} s",
                    "fencing waits for the OSD map"),
    ]
