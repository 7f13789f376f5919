"""Replication: `grove send | grove receive` between two pools against
`btrfs send | btrfs receive` between two btrfs file systems, in one run.

1. Transfers: a full transfer of a volume of random data (1 GiB; a file
   in a subvolume for btrfs), then 1% of its 4 KiB blocks rewritten at
   random (the same blocks and bytes on both sides; pwrite for btrfs), a
   snapshot, and the incremental transfer. Each through a pipe, each timed
   to the pipe's end and to the end of a `sync` after it (btrfs receive
   does not sync; grove receive does), with `sync` before every timed
   transfer. Each sender is also timed alone into `wc -c`, which gives
   the stream's bytes. The page cache is left as it is for both: the
   source data was written just before, and nothing is dropped. Rounds
   take turns (the order flips each round), each into fresh receivers;
   medians are kept, since fsync latency here swings from run to run.
2. A large sparse volume (1 TiB holding 4 GiB in a few hundred scattered
   extents): stream bytes against data bytes, and the time of the
   transfer. The btrfs peer gets the same content (`grove export`, holes
   stay holes) as a sparse file, and `btrfs send`'s bytes are counted.
3. 1,000 snapshots with no change between them sent as one stream
   (`send -I v@0 v@1000 -o FILE`) into a pool holding v@0; the sender and
   the receive (from the file) are timed apart.

Every transfer is verified: `grove hash` equal on both sides, and for
btrfs the SHA-256 of the received file equal to the sent one's. Both
pools and both file systems (sparse files on loop devices) sit in the
work directory, on the same disk. The file systems are unmounted and the
loop devices detached whatever happens."""

import contextlib
import hashlib
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess

import images
from loopfs import LoopBtrfs
from procs import CommandError
from procs import run as cmd

BLOCK_BYTES = 4096
MB = 1_000_000
MIB = 1 << 20
GIB = 1 << 30
TIMEOUT_S = 3600
SEED = 0x5EED_0009


def sh(script, timeout=TIMEOUT_S):
    """Runs a bash pipeline (pipefail: any stage failing fails it);
    returns (stdout, seconds)."""
    return cmd(["bash", "-c", "set -o pipefail; " + script], timeout=timeout)


def q(*args):
    return shlex.join(str(a) for a in args)


def sync():
    cmd(["sync"])


def timed_transfer(send, receive):
    """sync, then `send | receive` timed to the pipe's end and to the end
    of a sync after it (what it takes to be durable)."""
    sync()
    _, pipe_s = sh(f"{send} | {receive}")
    _, sync_s = cmd(["sync"])
    return {"pipe_s": pipe_s, "durable_s": pipe_s + sync_s}


def sender_alone(send):
    """sync, then the sender alone into `wc -c`: its time and the stream's bytes."""
    sync()
    out, seconds = sh(f"{send} | wc -c")
    return {"send_alone_s": seconds, "stream_bytes": int(out.split()[0])}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MIB):
            h.update(chunk)
    return h.hexdigest()


def btrfs_unavailable():
    if os.geteuid() != 0:
        return "not root: loop devices and mounts need root"
    for tool in ("mkfs.btrfs", "btrfs", "losetup", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} missing (btrfs-progs, mount)"
    with open("/proc/filesystems") as f:
        if "btrfs" not in f.read():
            subprocess.run(["modprobe", "btrfs"], capture_output=True)
            with open("/proc/filesystems") as g:
                if "btrfs" not in g.read():
                    return "the kernel has no btrfs"
    return None


def btrfs_on_loop(work, name, size_bytes):
    """A btrfs file system of `size_bytes` on one loop device in `work`,
    mounted; see LoopBtrfs."""
    return LoopBtrfs([work / f"{name}.img"], work / f"{name}.mnt", size_bytes)


def change_blocks(size_bytes, fraction, work):
    """The same 1% of the 4 KiB blocks, chosen at random, and fresh random
    bytes for them: extents as JSON and the bytes in a file, in order."""
    blocks = size_bytes // BLOCK_BYTES
    count = max(1, int(blocks * fraction))
    chosen = sorted(random.Random(SEED).sample(range(blocks), count))
    extents = work / "change.json"
    data = work / "change.bin"
    extents.write_text(json.dumps([[b * BLOCK_BYTES, BLOCK_BYTES] for b in chosen]))
    data.write_bytes(os.urandom(count * BLOCK_BYTES))
    return extents, data, count


def pwrite_extents(path, extents, data):
    """The change into a file: one pwrite per block, then fsync."""
    spans = json.loads(extents.read_text())
    with open(data, "rb") as src:
        fd = os.open(path, os.O_WRONLY)
        try:
            for offset, length in spans:
                os.pwrite(fd, src.read(length), offset)
            os.fsync(fd)
        finally:
            os.close(fd)


def scattered_extents(volume_bytes, data_bytes, count):
    """`count` extents holding `data_bytes` in all, one at a random place
    in each of `count` equal slots of the volume, of sizes between half
    and one and a half of the mean (in whole blocks)."""
    rng = random.Random(SEED + 1)
    slot = volume_bytes // count // BLOCK_BYTES * BLOCK_BYTES
    mean = data_bytes // count // BLOCK_BYTES
    sizes = []
    for _ in range(count // 2):
        d = rng.randrange(0, max(1, mean // 2))
        sizes += [mean + d, mean - d]
    if len(sizes) < count:
        sizes.append(mean)
    sizes[-1] += data_bytes // BLOCK_BYTES - sum(sizes)
    extents = []
    for i, blocks in enumerate(sizes):
        length = blocks * BLOCK_BYTES
        room = (slot - length) // BLOCK_BYTES
        if room < 0:
            raise ValueError(f"extent of {length} bytes does not fit a slot of {slot}")
        extents.append([i * slot + rng.randrange(0, room + 1) * BLOCK_BYTES, length])
    return extents


def mbps(nbytes, seconds):
    return nbytes / MB / seconds if seconds > 0 else None


def run(ctx):
    p = ctx.profile
    work = ctx.dir("replication")
    g = ctx.grove
    why_no_btrfs = btrfs_unavailable()
    result = {"cache": "buffered (warm, sync before each timed transfer, nothing dropped)",
              "btrfs": why_no_btrfs or "ok"}
    if why_no_btrfs:
        ctx.log(f"replication: no btrfs peer: {why_no_btrfs}")
    result["transfers"] = transfers(ctx, work, why_no_btrfs is None)
    result["sparse"] = sparse_volume(ctx, work, why_no_btrfs is None)
    result["snapshots"] = many_snapshots(ctx, work)
    result["metadata"] = g.metadata(result["transfers"]["receiving_pool"], f"replication (receiving pool, "
                                    f"{p.repl_bytes // MIB} MiB full + 1% incremental)")
    return result


def grove_send(g, pool, *args):
    return q(g.grove, "--pool", pool, "send", *args)


def grove_receive(g, pool, name, *args):
    return q(g.grove, "--pool", pool, "receive", name, *args)


def grove_hash(g, pool, name):
    return g.cli(pool, "hash", name)[0].split()[0]


def verify_grove(g, a, b, name):
    left, right = grove_hash(g, a, name), grove_hash(g, b, name)
    if left != right:
        raise CommandError(f"grove hash of {name} differs: {left} sent, {right} received")
    return left


def transfers(ctx, work, with_btrfs):
    """The full and the incremental transfer, grove and btrfs in turns,
    `repl_rounds` rounds (the order flips each round), each round into a
    fresh receiving pool and file system; the medians are kept. Both
    senders are made once: v@1, then the change, then v@2."""
    p = ctx.profile
    g = ctx.grove
    size = p.repl_bytes
    raw = work / "data.raw"
    images.make_raw(raw, size)
    extents, change, changed_blocks = change_blocks(size, p.repl_change_fraction, work)
    changed_bytes = changed_blocks * BLOCK_BYTES
    a = work / "a"
    g.init(a)
    g.import_image(a, "v", raw)
    g.cli(a, "snapshot", "v", "v@1")
    bench = g.bench_json("write-extents", "--pool", a, "--volume", "v",
                         "--extents", extents, "--data", change)
    if bench["bytes_written"] != changed_bytes:
        raise CommandError(f"write-extents wrote {bench['bytes_written']} bytes, not {changed_bytes}")
    g.cli(a, "snapshot", "v", "v@2")
    grove_digest = {snap: grove_hash(g, a, snap) for snap in ("v@1", "v@2")}
    if grove_digest["v@1"] == grove_digest["v@2"]:
        raise CommandError("v@2 hashes as v@1: the change did not land")
    samples = []

    def sample(system, kind, nbytes, timing, alone, verified, round_no):
        samples.append({"system": system, "transfer": kind, "round": round_no,
                        "data_bytes": nbytes, **timing, **alone, "verified": verified})

    def grove_round(round_no):
        b = work / f"b{round_no}"
        g.init(b)
        for kind, snap, base, nbytes in (("full", "v@1", (), size),
                                         ("incremental", "v@2", ("--from", "v@1"),
                                          changed_bytes)):
            ctx.log(f"replication: round {round_no + 1}, grove {kind}")
            send = grove_send(g, a, snap, *base)
            alone = sender_alone(send)
            timing = timed_transfer(send, grove_receive(g, b, snap))
            received = grove_hash(g, b, snap)
            if received != grove_digest[snap]:
                raise CommandError(f"grove hash of {snap} differs: {grove_digest[snap]} "
                                   f"sent, {received} received")
            sample("grove", kind, nbytes, timing, alone, f"grove hash {received[:16]}",
                   round_no)
        return b

    def btrfs_round(fa, round_no, digests):
        with btrfs_on_loop(work, f"btrfs-b{round_no}", size * 2 + GIB) as fb:
            for kind, snap, base, nbytes in (("full", "v@1", (), size),
                                             ("incremental", "v@2", ("-p", fa.path("v@1")),
                                              changed_bytes)):
                ctx.log(f"replication: round {round_no + 1}, btrfs {kind}")
                send = q("btrfs", "-q", "send", *base, fa.path(snap))
                alone = sender_alone(send)
                timing = timed_transfer(send, q("btrfs", "-q", "receive", fb.mnt))
                received = sha256(fb.path(snap, "data"))
                if received != digests[snap]:
                    raise CommandError(f"btrfs {snap}/data differs: sha256 {digests[snap]} "
                                       f"sent, {received} received")
                sample("btrfs", kind, nbytes, timing, alone, f"sha256 {received[:16]}",
                       round_no)

    receiving = None
    with contextlib.ExitStack() as stack:
        fa = None
        digests = {}
        if with_btrfs:
            fa = stack.enter_context(btrfs_on_loop(work, "btrfs-a", size * 3 + GIB))
            cmd(["btrfs", "-q", "subvolume", "create", fa.path("v")])
            images.copy(raw, fa.path("v", "data"))
            cmd(["btrfs", "-q", "subvolume", "snapshot", "-r", fa.path("v"), fa.path("v@1")])
            pwrite_extents(fa.path("v", "data"), extents, change)
            cmd(["btrfs", "-q", "subvolume", "snapshot", "-r", fa.path("v"), fa.path("v@2")])
            digests = {snap: sha256(fa.path(snap, "data")) for snap in ("v@1", "v@2")}
            if digests["v@1"] == digests["v@2"]:
                raise CommandError("btrfs v@2 reads as v@1: the change did not land")
        for round_no in range(p.repl_rounds):
            order = ["grove", "btrfs"] if round_no % 2 == 0 else ["btrfs", "grove"]
            for system in order:
                if system == "grove":
                    if receiving is not None:
                        shutil.rmtree(receiving)
                    receiving = grove_round(round_no)
                elif fa is not None:
                    btrfs_round(fa, round_no, digests)
    raw.unlink()
    rows = []
    for system in ("grove", "btrfs"):
        for kind in ("full", "incremental"):
            mine = [x for x in samples if x["system"] == system and x["transfer"] == kind]
            if not mine:
                continue
            row = {"system": system, "transfer": kind, "data_bytes": mine[0]["data_bytes"],
                   "rounds": len(mine), "verified": mine[-1]["verified"],
                   "stream_bytes": mine[-1]["stream_bytes"]}
            for key in ("pipe_s", "durable_s", "send_alone_s"):
                row[key] = statistics.median(x[key] for x in mine)
            row["mb_s"] = mbps(row["data_bytes"], row["durable_s"])
            row["pipe_mb_s"] = mbps(row["data_bytes"], row["pipe_s"])
            row["durable_s_range"] = [min(x["durable_s"] for x in mine),
                                      max(x["durable_s"] for x in mine)]
            rows.append(row)
    by = {(r["system"], r["transfer"]): r for r in rows}
    ratios = {}
    for kind in ("full", "incremental"):
        if ("btrfs", kind) in by:
            ratios[kind] = by[("grove", kind)]["mb_s"] / by[("btrfs", kind)]["mb_s"]
            ratios[kind + "_pipe"] = (by[("grove", kind)]["pipe_mb_s"]
                                      / by[("btrfs", kind)]["pipe_mb_s"])
    return {"data_bytes": size, "changed_blocks": changed_blocks, "rounds": p.repl_rounds,
            "rows": rows, "samples": samples, "grove_over_btrfs": ratios,
            "receiving_pool": str(receiving)}


def sparse_volume(ctx, work, with_btrfs):
    """A large volume holding little data in scattered extents: stream
    bytes over data bytes, and the transfer's time."""
    p = ctx.profile
    g = ctx.grove
    extents = scattered_extents(p.repl_big_volume_bytes, p.repl_big_data_bytes,
                                p.repl_big_extents)
    spans = work / "sparse.json"
    spans.write_text(json.dumps(extents))
    c, d = work / "c", work / "d"
    g.init(c)
    g.init(d)
    ctx.log(f"replication: {p.repl_big_volume_bytes // GIB} GiB volume holding "
            f"{p.repl_big_data_bytes // MIB} MiB in {len(extents)} extents")
    built = g.bench_json("write-extents", "--pool", c, "--volume", "big",
                         "--create-size", p.repl_big_volume_bytes, "--extents", spans)
    g.cli(c, "snapshot", "big", "big@1")
    data = built["bytes_written"]
    send = grove_send(g, c, "big@1")
    alone = sender_alone(send)
    timing = timed_transfer(send, grove_receive(g, d, "big@1"))
    digest = verify_grove(g, c, d, "big@1")
    out = {"volume_bytes": p.repl_big_volume_bytes, "data_bytes": data,
           "extents": len(extents), "grove_stream_bytes": alone["stream_bytes"],
           "grove_over_data": alone["stream_bytes"] / data,
           "grove_send_alone_s": alone["send_alone_s"], **timing,
           "mb_s": mbps(data, timing["durable_s"]), "verified": f"grove hash {digest[:16]}"}
    if with_btrfs:
        # The same content as a sparse file (grove export keeps holes).
        with btrfs_on_loop(work, "btrfs-c", p.repl_big_data_bytes * 2 + GIB) as fc:
            cmd(["btrfs", "-q", "subvolume", "create", fc.path("big")])
            g.cli(c, "export", "big@1", fc.path("big", "data"), timeout=TIMEOUT_S)
            if os.path.getsize(fc.path("big", "data")) != p.repl_big_volume_bytes:
                raise CommandError("grove export wrote a file of the wrong size")
            cmd(["btrfs", "-q", "subvolume", "snapshot", "-r", fc.path("big"),
                 fc.path("big@1")])
            b = sender_alone(q("btrfs", "-q", "send", fc.path("big@1")))
            out.update({"btrfs_stream_bytes": b["stream_bytes"],
                        "btrfs_over_data": b["stream_bytes"] / data,
                        "btrfs_send_alone_s": b["send_alone_s"]})
    return out


def many_snapshots(ctx, work):
    """v@0, then v@1 ... v@N with no writes between them, sent as one
    stream (-I v@0) into a pool that has v@0; sender and receiver timed
    apart (through a file)."""
    p = ctx.profile
    g = ctx.grove
    n = p.repl_snapshots
    e, f = work / "e", work / "f"
    g.init(f)
    spans = work / "snaps.json"
    spans.write_text(json.dumps([[0, p.repl_snapshot_data_bytes]]))
    g.bench_json("write-extents", "--pool", e, "--volume", "v", "--create-size", GIB,
                 "--extents", spans)
    g.cli(e, "snapshot", "v", "v@0")
    sh(f"{grove_send(g, e, 'v@0')} | {grove_receive(g, f, 'v@0')}")
    ctx.log(f"replication: {n} snapshots with no change, one stream")
    made = g.bench_json("empty-snapshots", "--pool", e, "--volume", "v",
                        "--first", 1, "--last", n)
    stream = work / "snaps.stream"
    sync()
    _, send_s = g.cli(e, "send", f"v@{n}", "-I", "v@0", "-o", stream)
    sync()
    _, receive_s = g.cli(f, "receive", f"v@{n}", stream)
    digest = verify_grove(g, e, f, f"v@{n}")
    verify_grove(g, e, f, f"v@{n // 2}")
    received = [v["name"] for v in json.loads(g.cli(f, "list", "--json")[0])
                if v["name"].startswith("v@")]
    if len(received) != n + 1:
        raise CommandError(f"{len(received)} snapshots v@* in the receiving pool, not {n + 1}")
    return {"snapshots": n, "data_bytes": p.repl_snapshot_data_bytes,
            "build_ms": made["build_ms"], "stream_bytes": stream.stat().st_size,
            "send_s": send_s, "receive_s": receive_s,
            "verified": f"{len(received)} snapshots, grove hash of v@{n} {digest[:16]}"}
