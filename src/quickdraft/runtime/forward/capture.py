"""Capturing the static forward's graphs (issue #70): CUDA graphs that share one memory pool, what
capturing cost (seconds, device memory), and captures that came late (inside a generation).

On a CUDA device a capture warms the callable up twice on a side stream (allocator, kernel
selection, as torch.cuda.graphs asks), puts back the inputs the warm-up advanced (a chain step moves
its own position), and records one `torch.cuda.CUDAGraph` into the pool every graph of the forward
shares: graphs replay one at a time on one stream and each keeps its outputs alive, so what one
graph's intermediates used, the next one may reuse (vLLM captures the same way, largest first).

`emulate=True` (a CPU; the tests) records an `EagerGraph` instead: replaying it reruns the callable
and copies the results into the outputs it gave at capture, as a graph replays into its fixed output
buffers. So everything around the capture (which buckets are captured when, the inputs put back,
outputs overwritten by the next replay) runs and is tested without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def copy_into(dst: Any, src: Any) -> None:
    """Copy a result (a tensor, None, or a tuple/list of them) into the same-shaped `dst` in place."""
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        for d, s in zip(dst, src, strict=True):
            copy_into(d, s)


class EagerGraph:
    """A CPU stand-in for `torch.cuda.CUDAGraph`: `replay()` reruns `run` into the first run's outputs.

    Args:
        run: the callable captured; its first result is `out`.
    """

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run
        self.out = run()

    def replay(self) -> None:
        copy_into(self.out, self.run())


class Capturer:
    """Captures the graphs of one static forward and keeps account of them.

    Args:
        emulate: record `EagerGraph`s (a CPU) instead of CUDA graphs.

    Attributes:
        seconds: wall seconds spent capturing (warm-ups included).
        bytes: device memory reserved by the captures (0 when emulated).
        count: graphs captured.
        late: graphs captured after `warm` was set (inside a generation: a capture it paid for).
        warm: set once the engine's warm-up captured every graph (`StaticBatchForward.prepare`).
    """

    def __init__(self, emulate: bool = False) -> None:
        self.emulate = emulate
        self.pool = None if emulate else torch.cuda.graph_pool_handle()
        self.seconds, self.bytes, self.count, self.late, self.warm = 0.0, 0, 0, 0, False

    def __call__(self, run: Callable[[], Any], inputs: dict[str, torch.Tensor]) -> tuple[Any, Any]:
        """A graph of `run()` over the buffers `inputs` (put back as they were after the warm-up
        runs); returns (the graph, run's outputs, which each replay overwrites)."""
        start = time.perf_counter()
        kept = {name: value.clone() for name, value in inputs.items()}
        reserved = 0 if self.emulate else torch.cuda.memory_reserved()
        if self.emulate:  # its one run is the warm-up
            graph: Any = EagerGraph(run)
        else:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(stream)
        for name, value in kept.items():  # the warm-up advanced a chain step's inputs: put them back
            inputs[name].copy_(value)
        if self.emulate:
            out = graph.out
        else:  # recorded, not run: the inputs stay as they are
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = run()
        if not self.emulate:
            self.bytes += torch.cuda.memory_reserved() - reserved
        self.seconds += time.perf_counter() - start
        self.count += 1
        self.late += self.warm
        return graph, out

    def report(self) -> dict[str, float | int]:
        """What capturing cost, for the bench: graphs, seconds, MiB, and the late ones."""
        return {
            "graphs": self.count,
            "capture_s": round(self.seconds, 3),
            "graph_mib": round(self.bytes / 2**20, 1),
            "late_captures": self.late,
        }
