"""fio jobs and their results. The same four jobs run against the plain
file (libaio, O_DIRECT) and against every NBD server (fio's nbd engine),
with the same numjobs, iodepth and runtime. Every run starts with no dirty
pages on the host (sync), so none pays for write-back another left behind."""

import json
import os

from procs import run

# name -> (fio rw, block size)
JOBS = {
    "seq-read": ("read", "1M"),
    "seq-write": ("write", "1M"),
    "rand-read": ("randread", "4k"),
    "rand-write": ("randwrite", "4k"),
}


def nbd_uri(sock, export):
    return f"nbd+unix:///{export}?socket={sock}"


def common_args(profile, job, name="job"):
    rw, bs = JOBS[job]
    return ["fio", f"--name={name}", f"--rw={rw}", f"--bs={bs}",
            f"--numjobs={profile.numjobs}", f"--iodepth={profile.iodepth}",
            f"--runtime={int(profile.runtime_s * 1000)}ms", "--time_based",
            "--group_reporting", "--output-format=json"]


def parse(text):
    """IOPS and MiB/s of a group-reported fio run. The nbd engine prints
    lines of its own before the JSON."""
    result = json.loads(text[text.index("{"):])
    job = result["jobs"][0]
    iops = job["read"]["iops"] + job["write"]["iops"]
    bw_kib = job["read"]["bw"] + job["write"]["bw"]
    return {"iops": iops, "mib_s": bw_kib / 1024}


def run_clean(profile, args):
    """Runs fio once the host has no dirty pages (sync), and parses it."""
    os.sync()
    out, _ = run(args, timeout=profile.runtime_s + 120)
    return parse(out)


def run_file(profile, job, path, size_bytes):
    """A job on a plain file with direct I/O: the limit."""
    args = common_args(profile, job) + ["--ioengine=libaio", "--direct=1",
                                         f"--filename={path}", f"--size={size_bytes}"]
    return run_clean(profile, args)


def run_nbd(profile, job, sock, export, extra=()):
    """A job through fio's nbd engine on one export."""
    args = common_args(profile, job) + ["--ioengine=nbd", f"--uri={nbd_uri(sock, export)}"]
    return run_clean(profile, args + list(extra))


def run_nbd_exports(profile, job, sock, exports):
    """One job per export, numjobs each, reported as one group."""
    rw, bs = JOBS[job]
    args = ["fio", f"--rw={rw}", f"--bs={bs}", f"--iodepth={profile.iodepth}",
            f"--runtime={int(profile.runtime_s * 1000)}ms", "--time_based",
            "--group_reporting", "--output-format=json", "--ioengine=nbd"]
    for i, export in enumerate(exports):
        args += [f"--name=job{i}", f"--uri={nbd_uri(sock, export)}"]
    return run_clean(profile, args)
