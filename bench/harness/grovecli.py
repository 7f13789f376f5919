"""The grove and grove-bench binaries as the suite drives them."""

import json
import re
import statistics

import images
from procs import Server, run


class Grove:
    def __init__(self, grove, grove_bench, work):
        self.grove = str(grove)
        self.bench = str(grove_bench)
        self.work = work
        self._serve_help = None

    def cli(self, pool, *args, timeout=600):
        return run([self.grove, "--pool", pool, *args], timeout=timeout)

    def init(self, pool):
        self.cli(pool, "init")

    def import_image(self, pool, name, image):
        self.cli(pool, "import", name, image)

    def pool_of_raw_image(self, work, image_bytes, *volumes):
        """A raw image of `image_bytes` made at work/disk.raw and a pool at
        work/pool holding it as each of `volumes`: (raw, pool)."""
        raw = work / "disk.raw"
        images.make_raw(raw, image_bytes)
        pool = work / "pool"
        self.init(pool)
        for volume in volumes:
            self.import_image(pool, volume, raw)
        return raw, pool

    def info(self, pool):
        out, _ = self.cli(pool, "info", "--json")
        return json.loads(out)

    def metadata(self, pool, workload):
        """Metadata bytes over data bytes, as `grove info --json` says them."""
        info = self.info(pool)
        data = info["referenced_bytes"]
        return {
            "workload": workload,
            "metadata_bytes": info["metadata_bytes"],
            "used_bytes": info["used_bytes"],
            "referenced_bytes": data,
            "volume_count": info["volume_count"],
            "metadata_over_data": info["metadata_bytes"] / data if data else None,
        }

    def timed(self, pool, *args, repeat=1):
        """Median wall seconds of a CLI command (opening the pool included)."""
        times = [self.cli(pool, *args)[1] for _ in range(repeat)]
        return statistics.median(times)

    def bench_json(self, *args, timeout=3600):
        out, _ = run([self.bench, *args], timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])

    def serve_help(self):
        if self._serve_help is None:
            self._serve_help, _ = run([self.grove, "serve", "--help"])
        return self._serve_help

    def cache_setting(self):
        """None if `grove serve` has no --cache-size yet, else the flag's
        help line (with its default, when it says one)."""
        for line in self.serve_help().splitlines():
            if "--cache-size" in line:
                return line.strip()
        return None

    def default_cache_bytes(self):
        """The default --cache-size, if the help text names one."""
        text = self.serve_help()
        start = text.find("--cache-size")
        if start < 0:
            return None
        match = re.search(r"default:\s*([0-9.]+)\s*([KMGT]?)i?B?", text[start:start + 600])
        return parse_size(match.group(1) + match.group(2)) if match else None

    def server(self, pool, sock, log_name, *flags):
        return Server("grove serve", [self.grove, "--pool", pool, "serve", "--socket", sock,
                                      *flags], sock, self.work / log_name)


def parse_size(text):
    text = text.strip().upper().rstrip("B").rstrip("I")
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    suffix = text[-1] if text and text[-1] in units else ""
    number = text[:-1] if suffix else text
    return int(float(number) * units[suffix])
