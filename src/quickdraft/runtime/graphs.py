"""Static shapes for the batched forward, and CUDA graphs over them (issue #27).

On a GPU a small model's forward waits on kernel launches, not on memory: a CUDA graph replays the
whole forward's kernels as one launch, but only over fixed buffers and shapes. So the batched
forward (`runtime/batched.py`) is made static here:
- every slot of the batch cache runs (idle slots write to their own unused positions and see only
  themselves), and the new rows of each row are padded to a width bucket (1, 2, 4, ..., 64);
- attention reads a span bucket of the cache (256, 512, ... positions, up to its preallocated
  capacity: the smallest that holds the longest row and its new rows) under a mask, which is an
  input buffer, as are the ids, positions and each row's write position. Reading the whole capacity
  (8192 positions for the default model) cost a verify 3.6 ms of attention on an H200 (issue #50's
  profile: 120 us a layer at width > 1), a span bucket what the context needs;
- one graph per (width, span) bucket, captured the first time it runs (after a warm-up on a side
  stream, as torch.cuda.graphs asks) and replayed after the round's inputs are copied in;
- a batch of one (a lone request) runs its LM head inside the graph too (its rows are all real or
  few); a wider batch runs the LM head over the rows that are not padding, after the graph;
- nothing is read back from the device: the real rows are picked by an index made on the host.

`QUICKDRAFT_COMPILE=1` (an experiment, CUDA only) runs the forward through `torch.compile` before it
is captured, to measure what fusing a layer's elementwise kernels would give (a captured step's time
is its kernel count: docs/gpu.md).

With `graphs=False` (a CPU, or a GPU with graphs switched off) the same static computation runs
eagerly: that is the path the CPU tests compare with the dynamic forward (equal logits in float64),
so only the capture itself is left to `scripts/gpu_check.sh`. A width beyond the last bucket, or a
row too long for the capacity, takes the dynamic forward.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from quickdraft.runtime.batched import BatchedTarget, RowBlock, block_inputs, pick_rows

WIDTHS = (1, 2, 4, 8, 16, 32, 64)
FIRST_SPAN = 256  # the smallest span bucket; each next one doubles, the last is the capacity


class StaticBatchForward:
    """The static (and, on CUDA, graphed) forward of a `BatchedTarget`.

    Args:
        target: the batched target (its cache is grown to `capacity` once, here).
        capacity: positions per row, preallocated (at most the model's context).
        graphs: capture CUDA graphs (default: when the model is on a CUDA device).
    """

    def __init__(self, target: BatchedTarget, capacity: int, graphs: bool | None = None) -> None:
        device = target.net.device
        self.graphs = device.type == "cuda" if graphs is None else graphs
        if self.graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.target = target
        target.cache.ensure(min(capacity, target.cache.limit))
        self.capacity = target.cache.capacity
        self.head_inside = target.max_batch == 1  # the LM head in the graph: a lone request's rows
        self.forward = target.net.forward_batch
        if self.graphs and os.environ.get("QUICKDRAFT_COMPILE") == "1":
            self.forward = torch.compile(self.forward, dynamic=False)
        self.inputs: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.captured: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.replays = 0

    @staticmethod
    def bucket(width: int) -> int | None:
        return next((w for w in WIDTHS if w >= width), None)

    def span(self, needed: int) -> int:
        """The span bucket that holds `needed` positions: FIRST_SPAN doubled, at most the capacity."""
        span = FIRST_SPAN
        while span < needed:
            span *= 2
        return min(span, self.capacity)

    def _buffers(self, key: tuple[int, int]) -> dict[str, torch.Tensor]:
        if key not in self.inputs:
            (width, span), b, dev = key, self.target.max_batch, self.target.net.device
            self.inputs[key] = {
                "ids": torch.zeros(b, width, dtype=torch.long, device=dev),
                "positions": torch.zeros(b, width, dtype=torch.long, device=dev),
                "mask": torch.zeros(b, width, span, dtype=torch.bool, device=dev),
                "starts": torch.zeros(b, dtype=torch.long, device=dev),
            }
        return self.inputs[key]

    def _run(self, buf: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B * width, H) states and, with the head inside, their (B * width, V) logits."""
        cache, span = self.target.cache, buf["mask"].shape[-1]
        cache.starts, cache.span, cache.groups = buf["starts"], span, None  # static: one call
        x = self.forward(cache, buf["ids"], buf["positions"], buf["mask"]).flatten(0, 1)
        return x, (self.target.single.logits(x) if self.head_inside else None)

    def _capture(self, key: tuple[int, int], buf: dict[str, torch.Tensor]) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocator, kernel selection)
                self._run(buf)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            buf["out"] = self._run(buf)
        self.captured[key] = graph

    @torch.inference_mode()
    def __call__(self, blocks: Sequence[RowBlock]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(sum n_b, H) the final-normed states of the blocks' rows, as `BatchedTarget.states_dynamic`,
        and their (sum n_b, V) logits when the LM head ran inside (else None: the caller's)."""
        target = self.target
        width = self.bucket(max(len(b.tokens) for b in blocks))
        lengths = target.lengths()
        if width is None or max(lengths) + width > self.capacity:
            return target.states_dynamic(blocks), None
        key = (width, self.span(max(lengths) + width))
        rows, slots = len(blocks), target.max_batch
        starts = torch.tensor(lengths + [0] * (slots - rows), dtype=torch.long)  # idle slots write at 0
        pad = [RowBlock([0])] * (slots - rows)
        ids, positions, mask, valid = block_inputs(list(blocks) + pad, starts, width, key[1])
        valid[rows:] = False
        buf = self._buffers(key)
        for name, value in (("ids", ids), ("positions", positions), ("mask", mask), ("starts", starts)):
            buf[name].copy_(value, non_blocking=True)
        if self.graphs:
            if key not in self.captured:
                self._capture(key, buf)
            self.captured[key].replay()
            x, logits = buf["out"]
        else:
            x, logits = self._run(buf)
        self.replays += 1
        target.num_forwards += 1
        pick = pick_rows(valid.flatten(), x.device)
        x, logits = x[pick], (None if logits is None else logits[pick])
        if self.graphs and isinstance(pick, slice):  # views of the graph's output, which the next replay
            x, logits = x.clone(), (None if logits is None else logits.clone())  # overwrites: a drafter keeps x
        return x, logits
