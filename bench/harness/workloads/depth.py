"""Snapshot depth: random 4K reads of the tip of a chain of clones, at
each depth, against qemu-nbd on the top of a qcow2 backing chain of the
same depth holding the same writes. Every depth gets a fresh server.

One grove pool holds one chain, d0 <- d0-1 <- ... <- d0-N; the volume at
depth d is d0-d (d0 itself at depth 0), whose ancestors are exactly d
clones deep. Likewise layer-d of one qcow2 chain has d overlays below it."""

import signal
import statistics

import fio
import images
import peers
from procs import CommandError

JOB = "rand-read"


def failure(error, log, died):
    """One line on how a peer failed: how it died, its own last log line,
    and what fio said."""
    parts = []
    if died is not None and died < 0:
        parts.append(f"qemu-nbd died of {signal.Signals(-died).name} during the reads")
    elif died is not None:
        parts.append(f"qemu-nbd exited {died} during the reads")
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    if lines:
        parts.append(lines[-1])
    fio_said = [line for line in str(error).splitlines() if "error" in line]
    if fio_said:
        parts.append("fio: " + fio_said[0].removeprefix("fio: ")[:160])
    return "; ".join(parts)[:400]


def run(ctx):
    p = ctx.profile
    work = ctx.dir("depth")
    raw, pool = ctx.grove.pool_of_raw_image(work, p.depth_image_bytes, "d0")
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

    # grove's figures are close to one another, so noise decides the ratio:
    # each depth is measured in every round (rounds go over all depths in
    # turn) and the median kept. qcow2's fall is far larger than the noise.
    grove_runs = {depth: [] for depth in p.depths}
    for round_no in range(p.depth_rounds):
        for depth in p.depths:
            export = "d0" if depth == 0 else f"d0-{depth}"
            sock = work / "grove.sock"
            ctx.log(f"depth: grove at {depth}, round {round_no + 1}/{p.depth_rounds}")
            with ctx.grove.server(pool, sock, "depth-grove.log", "--read-only",
                                  "--export", export):
                grove_runs[depth].append(fio.run_nbd(p, JOB, sock, export)["iops"])
    rows = []
    for depth in p.depths:
        ctx.log(f"depth: qcow2 at {depth}")
        row = {"depth": depth, "cache": "buffered",
               "grove_iops": statistics.median(grove_runs[depth]),
               "grove_iops_runs": grove_runs[depth], "qcow2_iops": None, "qcow2_ready_s": None}
        if depth in layers:
            sock = work / "qemu.sock"
            log = ctx.work / f"depth-qemu-{depth}.log"
            server = peers.qemu_nbd(layers[depth], "qcow2", sock, log, read_only=True)
            try:
                with server:
                    row["qcow2_ready_s"] = server.ready_s
                    qcow2 = fio.run_nbd(p, JOB, sock, "disk")
                    row["qcow2_iops"] = qcow2["iops"]
            except CommandError as e:
                # qemu recurses once per backing layer on a read, and past
                # some depth it runs out of stack: that is the depth qemu
                # allows, so say how it failed.
                row["qcow2_error"] = failure(e, log, server.died)
                ctx.log(f"depth: qcow2 at {depth} failed: {row['qcow2_error']}")
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
        "rounds": p.depth_rounds,
        "grove_chain_build_ms": built["build_ms"],
        "rows": rows,
        "metadata": ctx.grove.metadata(pool, f"depth (chain of {max_depth} clones)"),
    }
