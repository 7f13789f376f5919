"""The peers grove is measured against: qemu-nbd (in both cache modes) and
nbdkit's file plugin on a raw file, and qemu-nbd on a qcow2 chain."""

from procs import Server

# Enough client connections for fio's jobs (qemu-nbd serves one by default).
QEMU_SHARED_CONNECTIONS = 64

# cache mode as each row names it -> qemu-nbd flags
QEMU_CACHE_MODES = {
    "buffered": ["--cache=writeback", "--aio=threads"],
    "direct": ["--cache=none", "--aio=native"],
}


def qemu_nbd(image, fmt, sock, log, cache="buffered", read_only=False):
    args = ["qemu-nbd", f"--socket={sock}", f"--format={fmt}", "--persistent",
            f"--shared={QEMU_SHARED_CONNECTIONS}", "--export-name=disk",
            *QEMU_CACHE_MODES[cache]]
    if read_only:
        args.append("--read-only")
    return Server(f"qemu-nbd ({fmt}, {cache})", args + [str(image)], sock, log)


def nbdkit_file(image, sock, log):
    # The file plugin with its default cache: the host page cache (buffered).
    args = ["nbdkit", "--foreground", "--unix", str(sock), "file", f"file={image}"]
    return Server("nbdkit file", args, sock, log)
