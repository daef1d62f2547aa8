"""The memory a bench holds, all its processes together: the peak of their summed PSS, sampled.

Each process's peak RSS (VmHWM) overstates what processes hold together: pages they share (a GGUF
that two llama.cpp workers map, the page cache behind a memory-mapped safetensors file) count once in
each, and peaks reached at different times add up as if they were simultaneous. The proportional set
size (PSS, /proc/PID/smaps_rollup) splits every shared page between its mappers, so the PSS of the
bench and of every process under it sums to the physical memory they hold at that moment. `TreePeak`
samples that sum in a background thread and keeps its largest value (Linux only; elsewhere None).
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

from quickdraft.bench.peers.child import CHILD_PEAKS, peak_rss_kib, proc_kib


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), from /proc's children lists."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found += kids
            todo += kids
    return found


def pss_kib(pid: int) -> int:
    """A live process's proportional set size (KiB); 0 where it cannot be read (gone, no permission)."""
    return proc_kib(pid, "smaps_rollup", "Pss:")


def tree_pss_kib(pid: int) -> dict[int, int]:
    """{pid: PSS in KiB} of `pid` and every process below it."""
    return {p: pss_kib(p) for p in [pid, *descendants(pid)]}


def process_name(pid: int) -> str:
    """A short name for a process: its script or program (the bench, a llama.cpp worker, ...)."""
    try:
        args = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return str(pid)
    if b"-c" in args[1:2]:
        return "multiprocessing forkserver" if b"forkserver" in b" ".join(args) else "python -c"
    named = [a.decode(errors="replace") for a in args if not a.startswith(b"-")]
    if not named:
        return str(pid)
    return Path(named[1] if len(named) > 1 and "python" in Path(named[0]).name else named[0]).name


class TreePeak:
    """The largest summed PSS of a process tree, sampled every `interval` seconds while running.

    Args:
        pid: the tree's root (this process).
        interval: seconds between samples (a sample reads one small /proc file per process).
    """

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid, self.interval = pid, interval
        self.peak_kib = 0
        self.at_peak: dict[str, int] = {}  # process name -> PSS (MiB) at the peak, summed by name
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quickdraft-memory", daemon=True)

    @property
    def supported(self) -> bool:
        return Path(f"/proc/{self.pid}/smaps_rollup").is_file()

    def start(self) -> TreePeak:
        if self.supported:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> int:
        """Take one sample now; returns it (KiB)."""
        each = tree_pss_kib(self.pid)
        now = sum(each.values())
        if now > self.peak_kib:
            self.peak_kib, self.at_peak = now, {}
            for pid, kib in each.items():
                name = "bench" if pid == self.pid else process_name(pid)
                self.at_peak[name] = self.at_peak.get(name, 0) + round(kib / 1024)
        self.samples += 1
        return now

    def stop(self) -> int | None:
        """Stop sampling (after one last sample; a second call only answers); the peak in MiB, or None
        where PSS cannot be read."""
        if not self.supported:
            return None
        if not self._stop.is_set():
            self._stop.set()
            if self._thread.is_alive():
                self._thread.join()
            self.sample()
        return round(self.peak_kib / 1024)


def peak_rss_mib() -> dict[str, float]:
    """Peak resident memory (MiB): this process's, each peer process's (llama.cpp: read before it
    closed) and each process still running under this one (parallel PEARL's forkserver), and their
    sum (an upper bound on the peak of all together)."""
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    children = {name: round(kib / 1024) for name, kib in CHILD_PEAKS.items()}
    for pid in descendants(os.getpid()):
        name = process_name(pid)
        children[name] = children.get(name, 0) + round(peak_rss_kib(pid) / 1024)
    return {"bench": round(me), "children": children, "sum": round(me + sum(children.values()))}
