"""The archive tier at scale (issue 37 point 6): push, expire, check and
reads run in memory bounded by the read cache plus 64 MiB, whatever the
archive's size. `grove-bench archive-scale` makes an archive of
`archive_scale_snapshots` daily snapshots of a volume of
`archive_scale_volume_bytes`, each rewriting `archive_scale_changes`
random 4 KiB blocks of the one before, object by object as pushes lay it
out (10,000 pushes would take hours); `grove archive check` must find it
clean. Then, each its own process with its wall time and peak RSS (GNU time):
`grove archive list`, `check`, `check --deep`, `restore` of the newest
archived snapshot into a pool, `push` of a fresh pool snapshot on top (a
full push: the pool knows none of the archived snapshots), `expire` with
the year's policy (daily 7, weekly 4, monthly 12, yearly 3: nearly every
snapshot goes, and the versions the kept ones still use are copied), and
`check` again. Reads: `grove serve` offers an archived-only snapshot;
fio's random 4 KiB reads over it and nbdcopy of its data, with the
server's peak RSS (VmHWM). Each figure stands against the bound, the
cache (grove.toml's archive.cache_size) plus 64 MiB."""

import json
import subprocess
import time

import fio
from grovecli import parse_size
from procs import CommandError, run as run_command
from workloads.archive import KEEP, run_measured

DAY_S = 86_400
BOUND_EXTRA_BYTES = 64 << 20
# Blocks written into the pool's volume before the push on top.
PUSH_BLOCKS = 256


def measured(rows, bound, name, args):
    """Runs one command measured; notes it in `rows`; returns its output."""
    try:
        m = run_measured(args)
    except RuntimeError as e:
        raise CommandError(str(e)) from e
    rows.append({"command": name, "s": round(m["s"], 3), "peak_rss_bytes": m["peak_rss_bytes"],
                 "within_bound": m["peak_rss_bytes"] is not None
                 and m["peak_rss_bytes"] <= bound, "args": [str(a) for a in args[1:]]})
    return m["out"]


def make_pool(ctx, pool, url, cache, volume_bytes, image):
    """A pool whose archive is `url`, with volume vm of `volume_bytes` and
    a few blocks written, snapshotted as vm@fresh. No retention policy yet:
    with one, `grove serve`'s scheduler would snapshot and push vm while
    the reads are measured."""
    g = ctx.grove
    g.init(pool)
    with open(pool / "grove.toml", "a") as toml:
        toml.write(f'\n[archive]\nlocation = "{url}"\ncache_size = "{cache}"\n')
    g.cli(pool, "create", "vm", "--size", str(volume_bytes))
    blocks = volume_bytes // 4096
    g.bench_json("scribble", "--pool", pool, "--volume", "vm", "--image", image,
                 "--fraction", repr(min(1.0, PUSH_BLOCKS / blocks)), "--seed", "7")
    image.unlink()
    g.cli(pool, "snapshot", "vm", "vm@fresh")


def reads(ctx, pool, work, export, bound):
    """Random 4 KiB reads and a copy of the mapped data of archived-only
    snapshot `export` through `grove serve`, with the server's peak RSS."""
    p = ctx.profile
    sock = work / "serve.sock"
    uri = fio.nbd_uri(sock, export.replace("@", "%40"))
    with ctx.grove.server(pool, sock, "archive-scale-serve.log") as server:
        idle_kib = server.status_kib("VmHWM")
        args = ["fio", "--name=r", "--rw=randread", "--bs=4k", "--iodepth=16", "--numjobs=1",
                f"--runtime={int(p.archive_scale_read_s * 1000)}ms", "--time_based",
                "--output-format=json", "--ioengine=nbd", f"--uri={uri}"]
        random = fio.parse(run_command(args, timeout=p.archive_scale_read_s + 300)[0])
        started = time.monotonic()
        run_command(["nbdcopy", "--requests=16", uri, "null:"], timeout=3600)
        copy_s = time.monotonic() - started
        peak_kib = server.status_kib("VmHWM")
    return {"export": export, "idle_hwm_bytes": idle_kib * 1024,
            "peak_hwm_bytes": peak_kib * 1024, "within_bound": peak_kib * 1024 <= bound,
            "random_4k_iops": random["iops"], "random_s": p.archive_scale_read_s,
            "copy_mapped_s": copy_s}


def run(ctx):
    p = ctx.profile
    g = ctx.grove
    work = ctx.dir("archive_scale")
    store = work / "archive"
    url = f"file://{store}"
    cache = p.archive_scale_cache
    bound = parse_size(cache) + BOUND_EXTRA_BYTES
    newest = int(time.time()) - 2 * DAY_S
    ctx.log(f"archive_scale: making {p.archive_scale_snapshots} snapshots of "
            f"{p.archive_scale_volume_bytes >> 20} MiB")
    made = run_measured([g.bench, "archive-scale", "--to", url,
                         "--volume-bytes", p.archive_scale_volume_bytes,
                         "--snapshots", p.archive_scale_snapshots,
                         "--changes", p.archive_scale_changes,
                         "--newest-unix-secs", newest])
    summary = json.loads(made["out"].strip().splitlines()[-1])
    pool = work / "pool"
    make_pool(ctx, pool, url, cache, p.archive_scale_volume_bytes, work / "image.raw")
    archive = ["--to", url]
    G = [g.grove, "--pool", pool, "archive"]
    rows = []
    listing = json.loads(measured(rows, bound, "list", G + ["list", *archive, "--json"]))[0]
    checked = json.loads(measured(rows, bound, "check", G + ["check", *archive, "--json"]))
    if p.archive_scale_deep_check:
        measured(rows, bound, "check --deep", G + ["check", *archive, "--deep", "--json"])
    newest_name = summary["summary"]["newest"]
    ctx.log("archive_scale: restore, reads")
    measured(rows, bound, "restore", G + ["restore", newest_name, "vm@restored", *archive])
    g.cli(pool, "rm", "vm@restored")
    read = reads(ctx, pool, work, newest_name, bound)
    measured(rows, bound, "push", G + ["push", "vm", "--snapshot", "vm@fresh", *archive, "--json"])
    policy = ", ".join(f"{k} = {v}" for k, v in KEEP.items())
    with open(pool / "grove.toml", "a") as toml:
        toml.write(f"\n[retention.volumes]\nvm = {{ daily = 2, archive = {{ {policy} }} }}\n")
    expired = json.loads(measured(rows, bound, "expire", G + ["expire", *archive, "--json"]))[0]
    after = json.loads(measured(rows, bound, "check after expire",
                                G + ["check", *archive, "--json"]))
    kept = json.loads(measured(rows, bound, "list after expire",
                               G + ["list", *archive, "--json"]))[0]
    store_bytes = dir_bytes(store)
    return {
        "snapshots": p.archive_scale_snapshots, "volume_bytes": p.archive_scale_volume_bytes,
        "changes": p.archive_scale_changes, "cache": cache, "bound_bytes": bound,
        "make_s": made["s"], "made": summary["summary"],
        "listed": len(listing["snapshots"]), "needed_bytes": listing["needed_bytes"],
        "check_clean": not checked[0]["report"]["problems"],
        "check_after_expire_clean": not after[0]["report"]["problems"],
        "expired": len(expired["expired"]), "kept": len(kept["snapshots"]),
        "expire_bytes_copied": expired["bytes_copied"],
        "expire_bytes_deleted": expired["bytes_deleted"],
        "store_bytes_after": store_bytes,
        "commands": rows, "reads": read,
        "all_within_bound": all(r["within_bound"] for r in rows) and read["within_bound"],
        "metadata": g.metadata(pool, "archive_scale"),
    }


def dir_bytes(path):
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])

