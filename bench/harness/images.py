"""Raw images and qcow2 backing chains the peers serve."""

import json
import os

from procs import run

WRITE_CHUNK_BYTES = 4 << 20
QCOW2_CLUSTER_BYTES = 64 << 10  # qemu-img's default cluster size
QEMU_IO_COMMANDS_PER_CALL = 3000  # keeps one command line well under ARG_MAX


def make_raw(path, size_bytes):
    """A raw image full of random data, written once and copied to peers."""
    with open(path, "wb") as f:
        left = size_bytes
        while left:
            n = min(left, WRITE_CHUNK_BYTES)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())


def copy(src, dst):
    run(["cp", "--sparse=never", src, dst])


def qcow2_layer(work, level):
    return work / f"layer-{level}.qcow2"


def qcow2_chain(work, raw, size_bytes, offsets_file, max_depth):
    """layer-0 holds the raw image; layer-N is an overlay on layer-(N-1)
    holding, at each offset grove's chain wrote at level N, the whole qcow2
    cluster around it. Returns the path of each layer by depth."""
    levels = json.loads(offsets_file.read_text())[:max_depth]
    run(["qemu-img", "convert", "-O", "qcow2", raw, qcow2_layer(work, 0)])
    for level in range(1, len(levels) + 1):
        # -u: do not open the chain below to check it (that costs O(depth)).
        run(["qemu-img", "create", "-q", "-u", "-f", "qcow2", "-F", "qcow2",
             "-b", qcow2_layer(work, level - 1).name, qcow2_layer(work, level),
             str(size_bytes)])
    # One qemu-io writes into every overlay without opening its backing
    # chain ("backing": null); full-cluster writes need no copy from below.
    groups = []
    for level, offsets in enumerate(levels, start=1):
        spec = {"driver": "qcow2",
                "file": {"driver": "file", "filename": str(qcow2_layer(work, level))},
                "backing": None}
        group = ["-c", "open json:" + json.dumps(spec, separators=(",", ":"))]
        for offset in offsets:
            cluster = offset - offset % QCOW2_CLUSTER_BYTES
            group += ["-c", f"write -P {level % 251 + 1} {cluster} {QCOW2_CLUSTER_BYTES}"]
        groups.append(group + ["-c", "close"])
    call = []
    for group in groups:
        if call and len(call) + len(group) > 2 * QEMU_IO_COMMANDS_PER_CALL:
            run(["qemu-io", *call])
            call = []
        call += group
    if call:
        run(["qemu-io", *call])
    return {level: qcow2_layer(work, level) for level in range(len(levels) + 1)}
