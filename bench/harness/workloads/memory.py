"""Memory: peak RSS (VmHWM) of `grove serve` over a large volume with many
snapshots under random 4K reads, at the default cache and at a small one.
Reads go to the volume and to three of its snapshots at once, so the
server walks several trees. Each setting gets a fresh server."""

import fio

JOB = "rand-read"
KIB = 1024


def run(ctx):
    p = ctx.profile
    work = ctx.dir("memory")
    pool = work / "pool"
    built = ctx.grove.bench_json("memory-pool", "--pool", pool,
                                 "--size-gib", p.memory_volume_gib,
                                 "--stride-kib", p.memory_stride_kib,
                                 "--snapshots", p.memory_snapshots,
                                 "--writes-between", p.memory_writes_between)
    n = p.memory_snapshots
    exports = ["disk"] + [f"disk@{max(1, n * k // 3)}" for k in (1, 2, 3)]
    cache_flag = ctx.grove.cache_setting()
    settings = [("default", None, ctx.grove.default_cache_bytes())]
    if cache_flag is not None:
        from grovecli import parse_size
        settings.append(("small", p.memory_small_cache, parse_size(p.memory_small_cache)))
    rows = []
    sock = work / "grove.sock"
    for name, flag_value, cache_bytes in settings:
        flags = ["--read-only"] + (["--cache-size", flag_value] if flag_value else [])
        ctx.log(f"memory: {name} cache")
        with ctx.grove.server(pool, sock, "memory-grove.log", *flags) as server:
            idle_kib = server.status_kib("VmHWM")
            result = fio.run_nbd_exports(p, JOB, sock, exports)
            peak_kib = server.status_kib("VmHWM")
        rows.append({
            "cache": name,
            "cache_flag": flag_value,
            "cache_bytes": cache_bytes,
            "idle_hwm_bytes": idle_kib * KIB,
            "peak_hwm_bytes": peak_kib * KIB,
            "iops": result["iops"],
        })
    return {
        "volume_gib": p.memory_volume_gib,
        "snapshots": n,
        "blocks_written": built["blocks_written"],
        "build_ms": built["build_ms"],
        "exports_read": exports,
        "cache_setting": cache_flag or "no cache setting yet",
        "rows": rows,
        "metadata": ctx.grove.metadata(pool, f"memory ({p.memory_volume_gib} GiB, {n} snapshots)"),
    }
