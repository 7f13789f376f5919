"""Every process the suite starts: servers that listen on a unix socket
and are always stopped (also when the harness fails or is interrupted),
and one-shot commands with their wall time."""

import ctypes
import os
import signal
import socket
import subprocess
import time

SOCKET_WAIT_S = 120.0  # qemu-nbd opens a 1,000-deep qcow2 chain in ~30 s
STOP_GRACE_S = 15.0  # grove serve finishes requests and flushes within 10 s
PR_SET_PDEATHSIG = 1

_running = []


def _die_with_parent():
    # A server outlives nothing: if the harness is killed, so is the server.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class CommandError(RuntimeError):
    pass


def run(args, timeout=None, env=None):
    """Runs a command to completion; returns (stdout, seconds). A failure
    raises CommandError with the command's stderr."""
    started = time.monotonic()
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise CommandError(f"{' '.join(map(str, args))} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-2000:]}")
    return proc.stdout, seconds


class Server:
    """A server process listening on `sock`. Use as a context manager."""

    def __init__(self, name, args, sock, log_path, env=None):
        self.name = name
        self.env = env
        self.args = [str(a) for a in args]
        self.sock = str(sock)
        self.log_path = log_path
        self.proc = None
        self.ready_s = None
        # The exit status if the server had died before it was stopped.
        self.died = None

    def __enter__(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        log = open(self.log_path, "ab")
        started = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, env=self.env,
                                     preexec_fn=_die_with_parent)
        log.close()
        _running.append(self)
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - started
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def _wait_ready(self, started):
        while time.monotonic() - started < SOCKET_WAIT_S:
            if self.proc.poll() is not None:
                raise CommandError(f"{self.name} exited {self.proc.returncode} before "
                                   f"listening; log: {self.log_path}")
            if os.path.exists(self.sock):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    try:
                        s.connect(self.sock)
                        return
                    except OSError:
                        pass
            time.sleep(0.05)
        raise CommandError(f"{self.name} did not listen on {self.sock} "
                           f"within {SOCKET_WAIT_S} s")

    @property
    def pid(self):
        return self.proc.pid

    def status_kib(self, field):
        """A memory figure of /proc/PID/status, such as VmHWM or VmRSS, in KiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise CommandError(f"no {field} in /proc/{self.proc.pid}/status")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None and self.died is None:
                self.died = self.proc.returncode
            self._forget()
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._forget()

    def _forget(self):
        if self in _running:
            _running.remove(self)


def stop_all():
    """Stops every server still running (the harness's exit path)."""
    for server in list(_running):
        server.stop()
