"""Write after snapshot (ddsnap's "nsnaps" case): random 4K writes into a
volume right after a snapshot of it, against the same writes into a volume
that has no snapshot, in pairs, in one `grove serve`. Both volumes hold the
same data, written whole. Each fio job writes its own quarter of the volume
and visits no block twice (fio's random map), so every write after a
snapshot is the first one to its block since that snapshot.

A write after a snapshot must land in a new block, which is a new page of
the store file; a write with no snapshot overwrites a page the host already
caches. The host file system charges for that difference whatever grove
does, so the same pair runs through nbdkit's file plugin too, in turns with
grove: overwrites of a written raw file, and first writes into a sparse raw
file four times the size (new each time)."""

import dataclasses
import statistics

import fio
import images
import peers

JOB = "rand-write"
BLOCK_BYTES = 4096
# The sparse file of the host's first writes, in image sizes.
SPARSE_SCALE = 4


def run(ctx):
    p = dataclasses.replace(ctx.profile, runtime_s=ctx.profile.nsnaps_runtime_s)
    work = ctx.dir("nsnaps")
    raw, pool = ctx.grove.pool_of_raw_image(work, p.nsnaps_image_bytes, "snapped", "plain")
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
            host = host_pair(p, ctx, work, raw, region)
            # With fio's random map, a job that wrote less than its region
            # wrote each block once: every write was a first write.
            writes_per_job = after["iops"] * p.runtime_s / p.numjobs
            pairs.append({"snapshot": i, "no_snapshot_iops": none["iops"],
                          "first_writes_only": writes_per_job <= region // BLOCK_BYTES,
                          "after_snapshot_iops": after["iops"],
                          "ratio": after["iops"] / none["iops"],
                          "host_overwrite_iops": host["overwrite"],
                          "host_first_write_iops": host["first_write"],
                          "host_ratio": host["first_write"] / host["overwrite"],
                          "snapshot_cli_s": snapshot_s})
    raw.unlink()
    return {
        "image_bytes": p.nsnaps_image_bytes,
        "cache": "buffered",
        "pairs": pairs,
        "no_snapshot_iops": median(pairs, "no_snapshot_iops"),
        "after_snapshot_iops": median(pairs, "after_snapshot_iops"),
        "ratio_median": median(pairs, "ratio"),
        "ratio_min": min(x["ratio"] for x in pairs),
        "host_overwrite_iops": median(pairs, "host_overwrite_iops"),
        "host_first_write_iops": median(pairs, "host_first_write_iops"),
        "host_ratio_median": median(pairs, "host_ratio"),
        "metadata": ctx.grove.metadata(
            pool, f"nsnaps ({p.nsnaps_snapshots} snapshots, first writes after each)"),
    }


def median(pairs, key):
    return statistics.median(x[key] for x in pairs)


def host_pair(p, ctx, work, raw, region):
    """The same writes through nbdkit's file plugin: overwrites of a written
    raw file, then first writes into a sparse one that was never written.
    The sparse file is larger, so that no job comes back to a block it
    wrote before (a fast job would, in a region of the image's size)."""
    first_write_region = region * SPARSE_SCALE
    written = work / "written.raw"
    sparse = work / "sparse.raw"
    if not written.exists():
        images.copy(raw, written)
    with open(sparse, "wb") as f:
        f.truncate(p.nsnaps_image_bytes * SPARSE_SCALE)
    result = {}
    for key, image, size in (("overwrite", written, region),
                             ("first_write", sparse, first_write_region)):
        sock = work / "nbdkit.sock"
        regions = [f"--size={size}", f"--offset_increment={size}"]
        with peers.nbdkit_file(image, sock, ctx.work / "nsnaps-nbdkit.log"):
            result[key] = fio.run_nbd(p, JOB, sock, "disk", regions)["iops"]
    sparse.unlink()
    return result
