"""btrfs over loop devices on sparse image files, for the workloads that
compare against it (replication's send/receive, branches' RAID profiles)."""

import subprocess

from procs import run as run_cmd


class LoopBtrfs:
    """btrfs over one loop device per file of `images` (each a sparse file
    of `device_bytes`), made with `mkfs_args` besides the devices (a RAID
    profile, say) and mounted at `mnt`; unmounted, detached and its files
    removed on exit, whatever happened."""

    def __init__(self, images, mnt, device_bytes, mkfs_args=()):
        self.images = list(images)
        self.mnt = mnt
        self.device_bytes = device_bytes
        self.mkfs_args = list(mkfs_args)
        self.loops = []
        self.mounted = False

    def __enter__(self):
        try:
            for img in self.images:
                with open(img, "wb") as f:
                    f.truncate(self.device_bytes)
                out, _ = run_cmd(["losetup", "-f", "--show", img])
                self.loops.append(out.strip())
            run_cmd(["mkfs.btrfs", "-q", "-f", *self.mkfs_args, *self.loops])
            self.mnt.mkdir(exist_ok=True)
            run_cmd(["mount", self.loops[0], self.mnt])
            self.mounted = True
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        if self.mounted:
            if subprocess.run(["umount", str(self.mnt)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
            self.mounted = False
        for loop in self.loops:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        self.loops = []
        if self.mnt.exists():
            try:
                self.mnt.rmdir()
            except OSError:
                pass
        for img in self.images:
            img.unlink(missing_ok=True)

    def path(self, *parts):
        return self.mnt.joinpath(*parts)
