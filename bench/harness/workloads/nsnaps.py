"""Write after snapshot (ddsnap's "nsnaps" case): random 4K writes into a
volume right after a snapshot of it, against the same writes into a volume
that has no snapshot, in pairs, in one `grove serve`. Both volumes hold the
same data, written whole. Each fio job writes its own quarter of the volume
and visits no block twice (fio's random map), so every write after a
snapshot is the first one to its block since that snapshot."""

import statistics

import fio
import images

JOB = "rand-write"
BLOCK_BYTES = 4096


def run(ctx):
    p = ctx.profile
    work = ctx.dir("nsnaps")
    raw = work / "disk.raw"
    images.make_raw(raw, p.nsnaps_image_bytes)
    pool = work / "pool"
    ctx.grove.init(pool)
    ctx.grove.import_image(pool, "snapped", raw)
    ctx.grove.import_image(pool, "plain", raw)
    raw.unlink()
    region = p.nsnaps_image_bytes // p.numjobs
    # Each job has its own region, so no two jobs write one block.
    regions = [f"--size={region}", f"--offset_increment={region}"]
    sock = work / "grove.sock"
    pairs = []
    with ctx.grove.server(pool, sock, "nsnaps-grove.log"):
        for i in range(1, p.nsnaps_snapshots + 1):
            ctx.log(f"nsnaps: snapshot {i}/{p.nsnaps_snapshots}")
            none = fio.run_nbd(p, JOB, sock, "plain", regions)
            _, snapshot_s = ctx.grove.cli(pool, "snapshot", "snapped", f"snapped@{i}")
            after = fio.run_nbd(p, JOB, sock, "snapped", regions)
            # With fio's random map, a job that wrote less than its region
            # wrote each block once: every write was a first write.
            writes_per_job = after["iops"] * p.runtime_s / p.numjobs
            pairs.append({"snapshot": i, "no_snapshot_iops": none["iops"],
                          "first_writes_only": writes_per_job <= region // BLOCK_BYTES,
                          "after_snapshot_iops": after["iops"],
                          "ratio": after["iops"] / none["iops"],
                          "snapshot_cli_s": snapshot_s})
    return {
        "image_bytes": p.nsnaps_image_bytes,
        "cache": "buffered",
        "pairs": pairs,
        "no_snapshot_iops": statistics.median(x["no_snapshot_iops"] for x in pairs),
        "after_snapshot_iops": statistics.median(x["after_snapshot_iops"] for x in pairs),
        "ratio_median": statistics.median(x["ratio"] for x in pairs),
        "ratio_min": min(x["ratio"] for x in pairs),
        "metadata": ctx.grove.metadata(
            pool, f"nsnaps ({p.nsnaps_snapshots} snapshots, first writes after each)"),
    }
