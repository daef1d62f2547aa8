"""A peer in a child process: its crash is one method's failure, never the bench's (issue #47).

A peer is native code we did not build for this host (llama.cpp's `-march=native` wheel died of
SIGILL on an AMX Xeon and took pytest and the bench with it). `ChildPeer` starts a worker script
(`python WORKER`, standard library plus the peer's own package) and talks to it in JSON lines: a
request on its stdin, a reply on its stdout. When the child dies (a signal, an exit) the call raises
`PeerCrashed` with one line naming the peer and how it ended; the bench (`bench/runner.py`) drops
that method, goes on with the others and reports what died and why.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from quickdraft.errors import QuickdraftError


class PeerCrashed(QuickdraftError):
    """A peer's process ended while it was asked something (a signal or an exit)."""


def describe_exit(code: int | None) -> str:
    """How a process ended, from its return code: "killed by SIGILL (Illegal instruction)", "exited
    with status 3" or "is still running"."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"killed by signal {-code}"
        return f"killed by {name} ({signal.strsignal(-code)})"
    return f"exited with status {code}"


class PeerSkipped(PeerCrashed):
    """A peer that cannot run here (its optional package missing, its build refusing the model): the
    bench skips it with one line, as it does a crashed one."""


CHILD_PEAKS: dict[str, int] = {}  # peer name -> the largest peak RSS (KiB) one of its processes reached


def proc_kib(pid: int, file: str, key: str) -> int:
    """The KiB figure on the `key` line of a live process's /proc/PID/`file` (status, smaps_rollup);
    0 where it cannot be read (gone, no permission, no such line)."""
    try:
        with open(f"/proc/{pid}/{file}") as fh:
            return next((int(line.split()[1]) for line in fh if line.startswith(key)), 0)
    except (OSError, ValueError):
        return 0


def peak_rss_kib(pid: int) -> int:
    """A live process's peak resident memory (VmHWM, KiB); 0 where it cannot be read."""
    return proc_kib(pid, "status", "VmHWM:")


class ChildPeer:
    """A worker script in its own process.

    Args:
        name: the peer's name in messages (the bench method's text).
        worker: the script to run with this Python.
    """

    def __init__(self, name: str, worker: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(worker)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def call(self, op: str, **fields) -> dict:
        """Send one request and wait for its reply; raises PeerCrashed when the child died, and
        QuickdraftError with the child's message when it failed without dying."""
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (OSError, ValueError):  # the child is gone (a closed or broken pipe)
            line = ""
        if not line:
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            raise PeerCrashed(f"{self.name}: its process {describe_exit(code)} during '{op}'")
        reply = json.loads(line)
        if "error" in reply:
            raise QuickdraftError(f"{self.name}: {reply['error']}")
        return reply

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not within 10 s. Its peak RSS is kept (`CHILD_PEAKS`)."""
        CHILD_PEAKS[self.name] = max(CHILD_PEAKS.get(self.name, 0), peak_rss_kib(self.proc.pid))
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:  # what a dead child's pipe still buffered
                pass
