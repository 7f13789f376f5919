"""The limits and the NBD servers: the same four fio jobs on a plain file
(direct I/O with libaio, and buffered pread/pwrite), on qemu-nbd (buffered and direct), on nbdkit's file plugin
and on `grove serve`, all holding the same random data. Servers take turns
within each round; rounds repeat the whole set and the medians are kept."""

import statistics

import fio
import images
import peers

# target -> (what the row says, cache mode)
TARGETS = {
    "plain-direct": ("plain file, libaio (the limit)", "direct"),
    "plain-buffered": ("plain file, pread/pwrite (the buffered limit)", "buffered"),
    "qemu-nbd-buffered": ("qemu-nbd raw --cache=writeback", "buffered"),
    "qemu-nbd-direct": ("qemu-nbd raw --cache=none", "direct"),
    "nbdkit-file": ("nbdkit file plugin, raw", "buffered"),
    "grove": ("grove serve", "buffered"),
}
# The rows that are a plain file, no server: the limits.
PLAIN = ("plain-direct", "plain-buffered")


def run(ctx):
    p = ctx.profile
    work = ctx.dir("servers")
    raw = work / "disk.raw"
    images.make_raw(raw, p.servers_image_bytes)
    files = {}
    for target in PLAIN + ("qemu-nbd-buffered", "qemu-nbd-direct", "nbdkit-file"):
        files[target] = work / f"{target}.raw"
        images.copy(raw, files[target])
    pool = work / "pool"
    ctx.grove.init(pool)
    ctx.grove.import_image(pool, "disk", raw)
    raw.unlink()

    samples = {(t, j): [] for t in TARGETS for j in p.servers_jobs}
    ready_s = {}
    for round_no in range(p.servers_rounds):
        for target in TARGETS:
            ctx.log(f"servers: round {round_no + 1}/{p.servers_rounds}, {target}")
            if target in PLAIN:
                cache = TARGETS[target][1]
                for job in p.servers_jobs:
                    result = fio.run_file(p, job, files[target], p.servers_image_bytes, cache)
                    samples[(target, job)].append(result)
                continue
            sock = work / f"{target}.sock"
            log = f"servers-{target}.log"
            if target == "grove":
                server = ctx.grove.server(pool, sock, log)
            elif target == "nbdkit-file":
                server = peers.nbdkit_file(files[target], sock, ctx.work / log)
            else:
                cache = TARGETS[target][1]
                server = peers.qemu_nbd(files[target], "raw", sock, ctx.work / log, cache)
            with server:
                ready_s[target] = server.ready_s
                for job in p.servers_jobs:
                    samples[(target, job)].append(fio.run_nbd(p, job, sock, "disk"))

    rows = []
    for job in p.servers_jobs:
        for target, (label, cache) in TARGETS.items():
            runs = samples[(target, job)]
            rows.append({
                "job": job,
                "target": target,
                "label": label,
                "cache": cache,
                "iops": statistics.median(r["iops"] for r in runs),
                "mib_s": statistics.median(r["mib_s"] for r in runs),
                "iops_runs": [r["iops"] for r in runs],
            })
    return {
        "image_bytes": p.servers_image_bytes,
        "rounds": p.servers_rounds,
        "rows": rows,
        "metadata": ctx.grove.metadata(pool, "servers (one fully written volume)"),
    }
