"""Retention (issue 25 point 7): pruning thousands of snapshots and
listing a pool of 100,000 volumes while clients do I/O, on pools served by
`grove serve`, all in one run.

1. Prune: volumes r<N>x<K> (round K of `retention_rounds`, each alike:
   one round's worst request is one draw from fio's own heavy tail) with N
   hourly-ranked snapshots an hour apart (each
   with a 4 KiB write after it, so each leaves blocks to reclaim; built
   in-process by `grove-bench ranked-snapshots`) and a policy keeping the
   newest 2 hourly. While fio writes random 4 KiB blocks into another
   volume of the same pool (`busy`, written whole first, so every write
   overwrites) for a fixed window, `retention_prune_lead_s` in (fio at its
   steady pace), `grove prune VOLUME` (metadata work)
   and then `grove gc --wait` (reclaim) run through the control socket,
   each timed. The same window runs just before without any pruning.
   Compared: IOPS over the whole window and over the span prune and
   reclaim took (fio's 100 ms logs), and the worst single request
   latency in that span against the same span of the quiet window
   (iops_ratio_span, lat_max_ms against quiet_lat_max_ms); each phase
   apart too. Each count runs twice over: with fio's full load
   (`numjobs` x `iodepth`: the IOPS goal) and with the latency probe
   (one job, one request in flight: the worst-request goal), each on
   volumes of its own. Under the full load the worst request measures
   how long a request waits for one of 2 cores (the quiet window's own
   worst is 4 to 340 ms round to round); the probe leaves a core to
   spare, so what it waits for is the engine. The probe's window is
   sized from the full load's spans of the same count.
2. List: for each (volumes, window) of `retention_list_counts`, a pool
   with one volume and snapshots of it up to that many volumes. One fio
   client reads random 4 KiB blocks (iodepth 1) for the window while
   `grove list --json` runs through the control socket; the worst
   request latency during the list against the same span of a quiet
   window. With --grove-before, the same with an older grove's `serve`
   and `list` on the same pool.
3. Admin commands (issue 25 point 5): on the same pool and in the same
   kind of read window, `grove info`, `rename`, `resize` and `rm` through
   the control socket one after another, ADMIN_GAP_S apart, each timed;
   the worst read latency during each (fio's 100 ms rows that cover it)
   against the same spans of a quiet window. Each of them once computed
   its accounting under the state lock, which every client waited for.

The daemon's retention scheduler is kept from acting on its own
(GROVE_CLOCK_FILE names a file that does not exist, so it never reads a
time), so that only the timed `grove prune` removes anything."""

import json
import os
import subprocess
import time

import fio
from procs import CommandError, Server

MIB = 1 << 20
HOURLY = 2
KEEP_HOURLY = 2
HOUR_S = 3600
FIRST_UNIX_S = 1_700_000_000 // HOUR_S * HOUR_S
# Writes between snapshots land in the volume's first part, a block each
# in turn: big enough that no snapshot's block is written twice.
PREFILL_BYTES = 64 * MIB
VOLUME_BYTES = 1 << 30
LIST_READ_JOBS = 1
LIST_READ_DEPTH = 1
# The latency probe's fio: one job, one request in flight.
PROBE_JOBS = 1
PROBE_DEPTH = 1
# A probe window runs for its lead, then this many times the longest span
# prune and reclaim took under the full load, then PROBE_TAIL_S: reclaim
# paces itself against any busy client, so the probe's span is no longer.
PROBE_SPAN_FACTOR = 1.25
PROBE_TAIL_S = 3.0
FIO_GRACE_S = 120
# fio's first seconds fill the page cache, at a pace unlike the rest.
WARMUP_MS = 2000
# A stretch before or after pruning shorter than this is left out of the
# pruned window's own pace.
STEADY_PART_MIN_MS = 1000
# Between two timed admin commands: fio's 100 ms rows of one command do
# not overlap the next's.
ADMIN_GAP_S = 0.3


def run(ctx):
    p = ctx.profile
    work = ctx.dir("retention")
    result = {"prune": prune_rounds(ctx, work)}
    result["list_counts"] = [list_count(ctx, work, volumes, window)
                             for volumes, window in p.retention_list_counts]
    result["window_s"] = p.retention_window_s
    result["metadata"] = ctx.grove.metadata(work / "prune-pool",
                                            "retention (after pruning and reclaim)")
    return result


def no_scheduler_env(work):
    """The environment for `grove serve` whose scheduler never acts: its
    clock file is missing, so it never has a time to act at."""
    return {**os.environ, "GROVE_CLOCK_FILE": str(work / "no-clock")}


def serve(ctx, grove_bin, pool, sock, log):
    return Server("grove serve", [grove_bin, "--pool", pool, "serve", "--socket", sock],
                  sock, ctx.work / log, env=no_scheduler_env(ctx.work))


def snapshots_of(grove_bin, pool, volume):
    out, _ = run_cli(grove_bin, pool, "list", "--json")
    return [v for v in json.loads(out) if v["name"].startswith(volume + "@")]


def run_cli(grove_bin, pool, *args):
    started = time.monotonic()
    proc = subprocess.run([str(grove_bin), "--pool", str(pool), *map(str, args)],
                          capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise CommandError(f"grove {' '.join(map(str, args))} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-2000:]}")
    return proc.stdout, seconds


def build_prune_pool(ctx, pool):
    """The busy volume, written whole, and r<N>x<K> with N ranked snapshots
    and a policy keeping KEEP_HOURLY of them, for each N of the profile."""
    p = ctx.profile
    g = ctx.grove
    g.init(pool)
    extents = pool.parent / "busy.json"
    extents.write_text(json.dumps([[0, p.retention_busy_bytes]]))
    g.bench_json("write-extents", "--pool", pool, "--volume", "busy",
                 "--create-size", p.retention_busy_bytes, "--extents", extents)
    built = {}
    for case in prune_cases(p):
        n = case[0]
        volume = prune_volume(*case)
        ctx.log(f"retention: building {n:,} hourly snapshots of {volume}")
        built[case] = g.bench_json("ranked-snapshots", "--pool", pool, "--volume", volume,
                                "--create-size", VOLUME_BYTES, "--prefill-bytes",
                                PREFILL_BYTES, "--count", n, "--rank", HOURLY,
                                "--first-unix-secs", FIRST_UNIX_S, "--step-secs", HOUR_S,
                                "--writes-between", 1)
        g.cli(pool, "policy", "set", volume, "--hourly", KEEP_HOURLY)
    return built


def fio_window(ctx, sock, export, job, numjobs, iodepth, seconds, prefix, during=None):
    """fio for `seconds` (windowed logs at PREFIX); `during(started)` runs
    meanwhile, given the logs' time base (fio.mark_origin), and returns
    what it measured, timed with fio.ms_since(started). Returns (fio's
    summary, during's result)."""
    args = fio.logged_nbd_args(job, sock, export, seconds, numjobs, iodepth, prefix)
    os.sync()
    started = fio.mark_origin(prefix)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        events = during(started) if during else None
        out, err = proc.communicate(timeout=seconds + FIO_GRACE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise CommandError(f"fio exited {proc.returncode}: {err.strip()[-2000:]}")
    return fio.parse_summary(out), events


def timed_prune(ctx, pool, volume, now, lead_s):
    """`during` for the pruned window: after lead_s, `grove prune VOLUME`
    then `grove gc --wait`, each timed; times in ms since fio started."""
    grove_bin = ctx.grove.grove

    def during(started):
        time.sleep(lead_s)
        t = {"prune_start_ms": fio.ms_since(started)}
        _, t["prune_s"] = run_cli(grove_bin, pool, "prune", volume, "--now", f"@{now}")
        t["prune_end_ms"] = fio.ms_since(started)
        _, t["reclaim_s"] = run_cli(grove_bin, pool, "gc", "--wait")
        t["reclaim_end_ms"] = fio.ms_since(started)
        return t
    return during


# The two loads each count is pruned under: fio's full load (the IOPS
# goal) and the latency probe (the worst-request goal).
FULL_LOAD = "full"
PROBE_LOAD = "probe"


def prune_cases(p):
    """(snapshot count, load, round) of each prune round, in the order
    they run: for each count, `retention_rounds` under fio's full load,
    then as many under the probe, each on a volume of its own, since one
    round's worst request is one draw from fio's own heavy tail."""
    return [(n, load, k) for n in p.retention_counts for load in (FULL_LOAD, PROBE_LOAD)
            for k in range(p.retention_rounds)]


def prune_volume(n, load, k):
    return f"r{n}x{k}" if load == FULL_LOAD else f"r{n}p{k}"


def fio_load(p, load):
    """(jobs, iodepth) of the foreground fio under LOAD."""
    return (p.numjobs, p.iodepth) if load == FULL_LOAD else (PROBE_JOBS, PROBE_DEPTH)


def round_window(p, load, earlier):
    """(window, lead) in seconds of a round under LOAD, given the rounds
    of the same count run before it: the full load's from the profile,
    the probe's sized from the full load's longest span."""
    if load == FULL_LOAD:
        return p.retention_window_s, p.retention_prune_lead_s
    longest_s = max((x["span_ms"][1] - x["span_ms"][0]) / 1000 for x in earlier
                    if x["load"] == FULL_LOAD)
    window = p.retention_probe_lead_s + PROBE_SPAN_FACTOR * longest_s + PROBE_TAIL_S
    return min(window, p.retention_window_s), p.retention_probe_lead_s


def prune_rounds(ctx, work):
    p = ctx.profile
    pool = work / "prune-pool"
    built = build_prune_pool(ctx, pool)
    sock = work / "prune.sock"
    rounds = []
    with serve(ctx, ctx.grove.grove, pool, sock, "retention-prune.log"):
        for case in prune_cases(p):
            n, load, _ = case
            window, lead = round_window(p, load, [x for x in rounds if x["snapshots"] == n])
            rounds.append(prune_round(ctx, work, pool, sock, case, built[case], window, lead))
    return rounds


def prune_round(ctx, work, pool, sock, case, built, window, lead):
    """The quiet window, then the same window with prune and reclaim."""
    p = ctx.profile
    n, load, k = case
    jobs, depth = fio_load(p, load)
    now = built["last_unix_secs"] + HOUR_S // 2
    volume = prune_volume(*case)
    before = len(snapshots_of(ctx.grove.grove, pool, volume))
    if before != n:
        raise CommandError(f"{volume} has {before} snapshots before pruning, not {n}")
    ctx.log(f"retention: {volume}, {n:,} snapshots, {jobs} x {depth} in flight: "
            f"quiet window of {window:.1f} s")
    quiet_prefix = work / f"quiet-{volume}"
    quiet, _ = fio_window(ctx, sock, "busy", "rand-write", jobs, depth, window, quiet_prefix)
    ctx.log(f"retention: {volume}: window of {window:.1f} s with prune and reclaim")
    busy_prefix = work / f"prune-{volume}"
    during, t = fio_window(ctx, sock, "busy", "rand-write", jobs, depth, window, busy_prefix,
                           timed_prune(ctx, pool, volume, now, lead))
    left = len(snapshots_of(ctx.grove.grove, pool, volume))
    if left != KEEP_HOURLY:
        raise CommandError(f"{volume} has {left} snapshots after pruning, not {KEEP_HOURLY}")
    span = (t["prune_start_ms"], t["reclaim_end_ms"])
    quiet_span = fio.span_figures(quiet_prefix, jobs, *span)
    busy_span = fio.span_figures(busy_prefix, jobs, *span)
    # Each phase apart, against the same span of the quiet window: which
    # of the two a loss or a stall belongs to.
    phases = {}
    for name, (a, b) in {"prune": (t["prune_start_ms"], t["prune_end_ms"]),
                         "reclaim": (t["prune_end_ms"], t["reclaim_end_ms"])}.items():
        phase = fio.span_figures(busy_prefix, jobs, a, b)
        quiet_phase = fio.span_figures(quiet_prefix, jobs, a, b)
        phase["quiet_iops"] = quiet_phase["iops"]
        phase["quiet_lat_max_ms"] = quiet_phase["lat_max_ms"]
        phase["iops_ratio"] = (phase["iops"] / quiet_phase["iops"]
                               if quiet_phase["iops"] else None)
        phases[name] = phase
    steady = steady_outside(busy_prefix, jobs, span, window * 1000)
    return {
        "phases": phases,
        "steady_outside": steady,
        # Against the same fio run before and after prune and reclaim:
        # "without" a few seconds away, not a minute (the quiet window's
        # pace drifts by more than a 3 s span of pruning can cost).
        "iops_ratio_same_run": (busy_span["iops"] / steady["iops"]
                                if steady["iops"] else None),
        "snapshots": n, "load": load, "numjobs": jobs, "iodepth": depth, "round": k,
        "window_s": window, "lead_s": lead, "kept": left, "build_ms": built["build_ms"],
        "prune_s": t["prune_s"], "reclaim_s": t["reclaim_s"],
        "covered": t["reclaim_end_ms"] <= window * 1000,
        "span_ms": list(span),
        "quiet": quiet, "during": during,
        "quiet_span": quiet_span, "during_span": busy_span,
        "iops_ratio_window": during["iops"] / quiet["iops"],
        "iops_ratio_span": (busy_span["iops"] / quiet_span["iops"]
                            if quiet_span["iops"] else None),
        # The worst single request during prune and reclaim, and without.
        "lat_max_ms": busy_span["lat_max_ms"],
        "quiet_lat_max_ms": quiet_span["lat_max_ms"],
        "lat_max_excess_ms": busy_span["lat_max_ms"] - quiet_span["lat_max_ms"],
    }


def steady_outside(prefix, numjobs, span, window_ms):
    """IOPS of a logged fio run outside `span`, past its first WARMUP_MS
    (the page cache filling): the pruned window's own pace without
    pruning, before it began and after it ended, weighted by time."""
    parts = [(WARMUP_MS, span[0]), (span[1], window_ms)]
    parts = [(a, b) for a, b in parts if b - a >= STEADY_PART_MIN_MS]
    total_ms = sum(b - a for a, b in parts)
    if not total_ms:
        return {"iops": None, "ms": 0}
    iops = sum(fio.span_figures(prefix, numjobs, a, b)["iops"] * (b - a)
               for a, b in parts) / total_ms
    return {"iops": iops, "ms": total_ms}


def list_count(ctx, work, volumes, window):
    """`grove list` (and an older grove's, with --grove-before), then the
    admin commands, on a pool of `volumes` volumes, in read windows of
    `window` seconds."""
    pool = work / f"list-pool-{volumes}"
    case = {"volumes": volumes, "window_s": window,
            "list": list_stall(ctx, work, pool, volumes, window, ctx.grove.grove, "after")}
    if ctx.grove_before:
        case["list_before"] = list_stall(ctx, work, pool, volumes, window, ctx.grove_before,
                                         "before")
    # Last: its rename and rm change the pool the listings count.
    case["admin"] = admin_stall(ctx, work, pool, volumes, window)
    return case


def build_list_pool(ctx, pool, volumes):
    """One volume and snapshots of it, `volumes` volumes in all."""
    ctx.grove.init(pool)
    ctx.log(f"retention: building a pool of {volumes:,} volumes")
    return ctx.grove.bench_json("ranked-snapshots", "--pool", pool, "--volume", "v",
                                "--create-size", VOLUME_BYTES, "--prefill-bytes",
                                PREFILL_BYTES, "--count", volumes - 1)


def list_stall(ctx, work, pool, volumes, window, grove_bin, which):
    """A quiet read window, then the same with `grove list --json` in it."""
    p = ctx.profile
    built = build_list_pool(ctx, pool, volumes) if not pool.exists() else None
    sock = work / f"list-{volumes}-{which}.sock"
    result = {"grove": str(grove_bin), "volumes": volumes}
    if built:
        result["build_ms"] = built["build_ms"]

    def listing(started):
        time.sleep(p.retention_lead_s)
        t = {"start_ms": fio.ms_since(started)}
        out, t["list_s"] = run_cli(grove_bin, pool, "list", "--json")
        t["end_ms"] = fio.ms_since(started)
        t["listed"] = len(json.loads(out))
        return t

    with serve(ctx, grove_bin, pool, sock, f"retention-list-{volumes}-{which}.log"):
        ctx.log(f"retention: list ({volumes:,}, {which}): quiet window of {window} s")
        quiet_prefix = work / f"list-quiet-{volumes}-{which}"
        quiet, _ = fio_window(ctx, sock, "v", "rand-read", LIST_READ_JOBS, LIST_READ_DEPTH,
                              window, quiet_prefix)
        ctx.log(f"retention: list ({volumes:,}, {which}): window of {window} s "
                "with `grove list`")
        busy_prefix = work / f"list-busy-{volumes}-{which}"
        during, t = fio_window(ctx, sock, "v", "rand-read", LIST_READ_JOBS, LIST_READ_DEPTH,
                               window, busy_prefix, listing)
    if t["listed"] != volumes:
        raise CommandError(f"grove list ({which}) listed {t['listed']} volumes, "
                           f"not {volumes}")
    span = (t["start_ms"], t["end_ms"])
    quiet_span = fio.span_figures(quiet_prefix, LIST_READ_JOBS, *span)
    busy_span = fio.span_figures(busy_prefix, LIST_READ_JOBS, *span)
    result.update({
        "list_s": t["list_s"], "covered": t["end_ms"] <= window * 1000,
        "span_ms": list(span), "quiet": quiet, "during": during,
        "quiet_span": quiet_span, "during_span": busy_span,
        "stall_ms": busy_span["lat_max_ms"],
    })
    return result


def admin_commands(volumes):
    """The admin commands timed on the list pool (v and v@1 ... v@N): each
    as (label, arguments)."""
    n = volumes - 1
    return [("info", ["info", "--json"]),
            ("rename", ["rename", f"v@{n // 2}", "v@renamed"]),
            ("resize", ["resize", "v", str(2 * VOLUME_BYTES)]),
            ("rm", ["rm", f"v@{n // 3}"])]


def admin_stall(ctx, work, pool, volumes, window):
    """A quiet read window, then the same with `grove info`, `rename`,
    `resize` and `rm` in it, one after another: per command, its time and
    the worst read during it, and the same spans of the quiet window."""
    p = ctx.profile
    grove_bin = ctx.grove.grove
    sock = work / f"admin-{volumes}.sock"
    commands = admin_commands(volumes)

    def admin(started):
        time.sleep(p.retention_lead_s)
        timed = []
        for label, args in commands:
            t = {"command": label, "args": args, "start_ms": fio.ms_since(started)}
            _, t["s"] = run_cli(grove_bin, pool, *args)
            t["end_ms"] = fio.ms_since(started)
            timed.append(t)
            time.sleep(ADMIN_GAP_S)
        return timed

    with serve(ctx, grove_bin, pool, sock, f"retention-admin-{volumes}.log"):
        ctx.log(f"retention: admin commands ({volumes:,}): quiet window of {window} s")
        quiet_prefix = work / f"admin-quiet-{volumes}"
        fio_window(ctx, sock, "v", "rand-read", LIST_READ_JOBS, LIST_READ_DEPTH, window,
                   quiet_prefix)
        ctx.log(f"retention: admin commands ({volumes:,}): window of {window} s with "
                f"{', '.join(label for label, _ in commands)}")
        busy_prefix = work / f"admin-busy-{volumes}"
        _, timed = fio_window(ctx, sock, "v", "rand-read", LIST_READ_JOBS, LIST_READ_DEPTH,
                              window, busy_prefix, admin)
    rows = []
    for t in timed:
        span = (t["start_ms"], t["end_ms"])
        quiet_span = fio.span_figures(quiet_prefix, LIST_READ_JOBS, *span)
        busy_span = fio.span_figures(busy_prefix, LIST_READ_JOBS, *span)
        rows.append({"command": t["command"], "args": t["args"], "s": t["s"],
                     "span_ms": list(span), "covered": t["end_ms"] <= window * 1000,
                     "quiet_span": quiet_span, "during_span": busy_span,
                     "stall_ms": busy_span["lat_max_ms"]})
    return {"volumes": volumes, "commands": rows,
            "stall_ms": max(r["stall_ms"] for r in rows)}
