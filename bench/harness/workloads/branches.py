"""A pool over several branches (issue 27 point 9), in one run with its
peers, every branch and loop device a file or directory on the work
directory's disk:

1. Random 4 KiB reads and 1 MiB sequential writes through `grove serve`
   (fio's nbd engine) on the single-file pool and on pools over branch
   directories (RAIF1 over 2, RAIF5 and RAIF6 over 4; writes end with a
   flush), against btrfs's
   own raid1 (2 loop devices) and raid5 (4) profiles (fio on a file,
   libaio, buffered like grove). Every target holds the same random data;
   the page cache is dropped before each job so no target reads another's
   cache; targets take turns within each round.
2. Rebuild: the RAIF5 pool served, one branch taken out (`grove branch
   fail`), then `grove rebuild --branch b1 --to NEW` through the control
   socket while fio reads random 4 KiB blocks. Rebuild throughput (bytes
   written to the replacement over the rebuild's time) against the same
   disk's sequential write speed (fio, 1 MiB direct writes of as many
   bytes into a file beside it); foreground IOPS during the rebuild against
   the same span of a window without it.

btrfs needs root (loop devices, mounts): without it the btrfs rows say why
they are missing, and the grove figures still stand."""

import os
import pathlib
import statistics
import time

import fio
import images
from loopfs import LoopBtrfs
from procs import Server
from procs import run as run_cmd
from workloads.replication import btrfs_unavailable
from workloads.retention import fio_window

LEAD_S = 1.0
JOBS = ("rand-read", "seq-write")
# target -> (what the row says, level, branches); level None: single file
GROVE_TARGETS = {
    "grove-file": ("grove serve, single-file pool", None, 1),
    "grove-raif1x2": ("grove serve, RAIF1 over 2 branches", "raif1", 2),
    "grove-raif5x4": ("grove serve, RAIF5 over 4 branches", "raif5", 4),
    "grove-raif6x4": ("grove serve, RAIF6 over 4 branches", "raif6", 4),
}
BTRFS_TARGETS = {
    "btrfs-raid1x2": ("btrfs raid1 over 2 loop devices", "raid1", 2),
    "btrfs-raid5x4": ("btrfs raid5 over 4 loop devices", "raid5", 4),
}


def drop_caches():
    os.sync()
    try:
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass  # not root: the rows say so through the cache field


def caches_droppable():
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def btrfs_raid(work, name, profile, count, device_bytes):
    """btrfs with data and metadata in `profile` over `count` loop devices
    on image files in `work`; see LoopBtrfs."""
    files = [work / f"{name}-{i}.img" for i in range(count)]
    return LoopBtrfs(files, work / f"{name}-mnt", device_bytes, ["-d", profile, "-m", profile])


def grove_pool(ctx, work, target, raw):
    """A pool for a grove target, holding `raw` as volume disk."""
    _, level, count = GROVE_TARGETS[target]
    pool = work / f"{target}-pool"
    args = ["init"]
    if level:
        for i in range(count):
            args += ["--branch", work / f"{target}-branch{i}"]
        args += ["--level", level]
    ctx.grove.cli(pool, *args)
    ctx.grove.import_image(pool, "disk", raw)
    return pool


def fio_file(profile, job, path, size_bytes):
    """A job on a file in a btrfs mount: libaio, buffered (as grove's page
    cache is), fsync at the end of writes."""
    args = fio.common_args(profile, job) + ["--ioengine=libaio", "--direct=0",
                                            f"--filename={path}", f"--size={size_bytes}"]
    if job == "seq-write":
        args.append("--end_fsync=1")
    return fio.run_clean(profile, args)


def measure_targets(ctx, work, raw):
    p = ctx.profile
    size = p.branches_image_bytes
    pools = {t: grove_pool(ctx, work, t, raw) for t in GROVE_TARGETS}
    why_no_btrfs = btrfs_unavailable()
    samples = {}
    for round_no in range(p.branches_rounds):
        for target in GROVE_TARGETS:
            ctx.log(f"branches: round {round_no + 1}/{p.branches_rounds}, {target}")
            sock = work / f"{target}.sock"
            with ctx.grove.server(pools[target], sock, f"branches-{target}.log"):
                for job in JOBS:
                    drop_caches()
                    # Writes end with a flush, as btrfs's end with an fsync.
                    extra = ["--end_fsync=1"] if job == "seq-write" else []
                    samples.setdefault((target, job), []).append(
                        fio.run_nbd(p, job, sock, "disk", extra))
        if why_no_btrfs:
            continue
        for target, (_, profile, count) in BTRFS_TARGETS.items():
            ctx.log(f"branches: round {round_no + 1}/{p.branches_rounds}, {target}")
            # Room for the data in its profile, twice over, and metadata.
            device_bytes = max(size * 3 // max(count - 1, 1), 512 << 20)
            with btrfs_raid(work, target, profile, count, device_bytes) as fs:
                path = fs.mnt / "disk.raw"
                images.copy(raw, path)
                os.sync()
                for job in JOBS:
                    drop_caches()
                    samples.setdefault((target, job), []).append(
                        fio_file(p, job, path, size))
    rows = []
    single = {job: statistics.median(r["iops"] for r in samples[("grove-file", job)])
              for job in JOBS}
    for target, (label, *_rest) in {**GROVE_TARGETS, **BTRFS_TARGETS}.items():
        for job in JOBS:
            runs = samples.get((target, job))
            if not runs:
                rows.append({"target": target, "label": label, "job": job,
                             "missing": why_no_btrfs})
                continue
            iops = statistics.median(r["iops"] for r in runs)
            rows.append({"target": target, "label": label, "job": job, "iops": iops,
                         "mib_s": statistics.median(r["mib_s"] for r in runs),
                         "iops_runs": [r["iops"] for r in runs],
                         "over_single_file": iops / single[job] if single[job] else None})
    # Each grove branch pool against the btrfs profile of the same kind.
    for row in rows:
        peer = {"grove-raif1x2": "btrfs-raid1x2", "grove-raif5x4": "btrfs-raid5x4",
                "grove-raif6x4": "btrfs-raid5x4"}.get(row["target"])
        match = [r for r in rows if r["target"] == peer and r["job"] == row["job"]
                 and "iops" in r]
        if peer and match and "iops" in row:
            row["over_btrfs"] = row["iops"] / match[0]["iops"]
            row["btrfs_peer"] = peer
    return rows, pools


def seq_write_speed(ctx, work, nbytes):
    """The disk's own sequential write speed: 1 MiB direct writes of
    `nbytes` into a new file beside the branches, MiB/s."""
    p = ctx.profile
    path = work / "seq-write-peer.raw"
    args = ["fio", "--name=seqpeer", "--rw=write", "--bs=1M", "--numjobs=1",
            "--iodepth=16", "--ioengine=libaio", "--direct=1", f"--filename={path}",
            f"--size={nbytes}", "--end_fsync=1", "--output-format=json"]
    os.sync()
    out, _ = run_cmd(args, timeout=p.runtime_s + 600)
    path.unlink(missing_ok=True)
    return fio.parse(out)["mib_s"]


def read_window(ctx, sock, prefix, during=None):
    """Random 4K reads of disk for the rebuild window, cache dropped first
    (retention's fio_window: windowed logs at PREFIX, `during` meanwhile)."""
    p = ctx.profile
    drop_caches()
    return fio_window(ctx, sock, "disk", "rand-read", p.numjobs, p.iodepth,
                      p.branches_rebuild_window_s, prefix, during)


def rebuild(ctx, work, pool):
    """Fail b1 of the served RAIF5 pool, then rebuild it onto a new
    directory under random reads; the same reads without it first."""
    p = ctx.profile
    window = p.branches_rebuild_window_s
    sock = work / "rebuild.sock"
    new_dir = work / "rebuild-new-b1"
    with Server("grove serve", [ctx.grove.grove, "--pool", pool, "serve", "--socket", sock],
                sock, ctx.work / "branches-rebuild.log"):
        ctx.grove.cli(pool, "branch", "fail", "b1")
        quiet_prefix = work / "rebuild-quiet"
        quiet, _ = read_window(ctx, sock, quiet_prefix)

        def during(started):
            time.sleep(LEAD_S)
            t = {"start_ms": fio.ms_since(started)}
            _, t["rebuild_s"] = ctx.grove.cli(pool, "rebuild", "--branch", "b1",
                                              "--to", new_dir, timeout=3600)
            t["end_ms"] = fio.ms_since(started)
            return t
        busy_prefix = work / "rebuild-busy"
        busy, t = read_window(ctx, sock, busy_prefix, during)
        info = ctx.grove.info(pool)
    written = (new_dir / "grove.branch").stat().st_size
    span = (t["start_ms"], t["end_ms"])
    quiet_span = fio.span_figures(quiet_prefix, p.numjobs, *span)
    busy_span = fio.span_figures(busy_prefix, p.numjobs, *span)
    seq_mib_s = seq_write_speed(ctx, work, written)
    rebuild_mib_s = written / (1 << 20) / t["rebuild_s"]
    return {
        "bytes_written": written,
        "rebuild_s": t["rebuild_s"],
        "rebuild_mib_s": rebuild_mib_s,
        "disk_seq_write_mib_s": seq_mib_s,
        "rebuild_over_seq_write": rebuild_mib_s / seq_mib_s if seq_mib_s else None,
        "covered": t["end_ms"] <= window * 1000,
        "span_ms": list(span),
        "quiet": quiet, "during": busy,
        "quiet_span": quiet_span, "during_span": busy_span,
        "iops_ratio_span": (busy_span["iops"] / quiet_span["iops"]
                            if quiet_span["iops"] else None),
        "branches_after": info.get("branches"),
    }


def run(ctx):
    p = ctx.profile
    work = ctx.dir("branches")
    raw = work / "disk.raw"
    images.make_raw(raw, p.branches_image_bytes)
    rows, pools = measure_targets(ctx, work, raw)
    raw.unlink()
    ctx.log("branches: rebuild of a RAIF5 branch under random reads")
    result = {
        "image_bytes": p.branches_image_bytes,
        "rounds": p.branches_rounds,
        "cache": "dropped before each job" if caches_droppable() else "not dropped (not root)",
        "rows": rows,
        "rebuild": rebuild(ctx, work, pools["grove-raif5x4"]),
    }
    return result
