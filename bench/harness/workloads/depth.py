"""Snapshot depth: random 4K reads of the tip of a chain of clones, at
each depth, against qemu-nbd on the top of a qcow2 backing chain of the
same depth holding the same writes. Every depth gets a fresh server.

One grove pool holds one chain, d0 <- d0-1 <- ... <- d0-N; the volume at
depth d is d0-d (d0 itself at depth 0), whose ancestors are exactly d
clones deep. Likewise layer-d of one qcow2 chain has d overlays below it."""

import fio
import images
import peers

JOB = "rand-read"


def run(ctx):
    p = ctx.profile
    work = ctx.dir("depth")
    raw = work / "disk.raw"
    images.make_raw(raw, p.depth_image_bytes)
    pool = work / "pool"
    ctx.grove.init(pool)
    ctx.grove.import_image(pool, "d0", raw)
    max_depth = max(p.depths)
    offsets = work / "offsets.json"
    built = ctx.grove.bench_json("chain", "--pool", pool, "--base", "d0",
                                 "--depth", max_depth,
                                 "--writes-per-level", p.depth_writes_per_level,
                                 "--offsets-out", offsets)
    qcow2_depth = min(p.qcow2_max_depth, max_depth)
    ctx.log(f"depth: grove chain of {max_depth} built in {built['build_ms']:.0f} ms; "
            f"building a qcow2 chain of {qcow2_depth}")
    layers = images.qcow2_chain(work, raw, p.depth_image_bytes, offsets, qcow2_depth)
    raw.unlink()

    rows = []
    for depth in p.depths:
        export = "d0" if depth == 0 else f"d0-{depth}"
        sock = work / "grove.sock"
        ctx.log(f"depth: {depth}")
        with ctx.grove.server(pool, sock, "depth-grove.log", "--read-only",
                              "--export", export) as server:
            grove = fio.run_nbd(p, JOB, sock, export)
            grove_ready_s = server.ready_s
        row = {"depth": depth, "cache": "buffered", "grove_iops": grove["iops"],
               "grove_ready_s": grove_ready_s, "qcow2_iops": None, "qcow2_ready_s": None}
        if depth in layers:
            sock = work / "qemu.sock"
            with peers.qemu_nbd(layers[depth], "qcow2", sock, ctx.work / "depth-qemu.log",
                                read_only=True) as server:
                qcow2 = fio.run_nbd(p, JOB, sock, "disk")
                row["qcow2_iops"] = qcow2["iops"]
                row["qcow2_ready_s"] = server.ready_s
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["grove_vs_depth0"] = row["grove_iops"] / base["grove_iops"]
        if row["qcow2_iops"] is not None and base["qcow2_iops"]:
            row["qcow2_vs_depth0"] = row["qcow2_iops"] / base["qcow2_iops"]
        else:
            row["qcow2_vs_depth0"] = None
    return {
        "image_bytes": p.depth_image_bytes,
        "writes_per_level": p.depth_writes_per_level,
        "qcow2_max_depth": qcow2_depth,
        "grove_chain_build_ms": built["build_ms"],
        "rows": rows,
        "metadata": ctx.grove.metadata(pool, f"depth (chain of {max_depth} clones)"),
    }
