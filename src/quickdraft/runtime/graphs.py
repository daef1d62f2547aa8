"""Static shapes for the batched forward, and CUDA graphs over them (issue #27).

On a GPU a small model's forward waits on kernel launches, not on memory: a CUDA graph replays the
whole forward's kernels as one launch, but only over fixed buffers and shapes. So the batched
forward (`models/batched.py`) is made static here:
- every slot of the batch cache runs (idle slots write to their own unused positions and see only
  themselves), and the new rows of each row are padded to a width bucket (1, 2, 4, ..., 64);
- attention reads the cache's whole preallocated capacity under a mask, which is an input buffer,
  as are the ids, positions and each row's write position;
- one graph per width bucket, captured the first time that bucket runs (after a warm-up on a side
  stream, as torch.cuda.graphs asks) and replayed after the round's inputs are copied in.
Only the LM head over the rows that are not padding runs outside the graph (its row count varies).

With `graphs=False` (a CPU, or a GPU with graphs switched off) the same static computation runs
eagerly: that is the path the CPU tests compare with the dynamic forward (equal logits in float64),
so only the capture itself is left to `scripts/gpu_check.sh`. A width beyond the last bucket, or a
row too long for the capacity, takes the dynamic forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.runtime.batched import BatchedTarget, RowBlock, block_inputs

WIDTHS = (1, 2, 4, 8, 16, 32, 64)


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
        self.inputs: dict[int, dict[str, torch.Tensor]] = {}
        self.captured: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0

    @staticmethod
    def bucket(width: int) -> int | None:
        return next((w for w in WIDTHS if w >= width), None)

    def _buffers(self, width: int) -> dict[str, torch.Tensor]:
        if width not in self.inputs:
            b, dev = self.target.max_batch, self.target.net.device
            self.inputs[width] = {
                "ids": torch.zeros(b, width, dtype=torch.long, device=dev),
                "positions": torch.zeros(b, width, dtype=torch.long, device=dev),
                "mask": torch.zeros(b, width, self.capacity, dtype=torch.bool, device=dev),
                "starts": torch.zeros(b, dtype=torch.long, device=dev),
            }
        return self.inputs[width]

    def _run(self, buf: dict[str, torch.Tensor]) -> torch.Tensor:
        cache = self.target.cache
        cache.starts, cache.span, cache.groups = buf["starts"], self.capacity, None  # static: one call
        return self.target.net.forward_batch(cache, buf["ids"], buf["positions"], buf["mask"])

    def _capture(self, width: int, buf: dict[str, torch.Tensor]) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocator, kernel selection)
                self._run(buf)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            buf["out"] = self._run(buf)
        self.captured[width] = graph

    @torch.inference_mode()
    def __call__(self, blocks: Sequence[RowBlock]) -> torch.Tensor:
        """(sum n_b, H) the final-normed states of the blocks' rows, as `BatchedTarget.states_dynamic`."""
        target = self.target
        width = self.bucket(max(len(b.tokens) for b in blocks))
        lengths = target.lengths()
        if width is None or max(lengths) + width > self.capacity:
            return target.states_dynamic(blocks)
        rows, slots = len(blocks), target.max_batch
        starts = torch.tensor(lengths + [0] * (slots - rows), dtype=torch.long)  # idle slots write at 0
        pad = [RowBlock([0])] * (slots - rows)
        ids, positions, mask, valid = block_inputs(list(blocks) + pad, starts, width, self.capacity)
        valid[rows:] = False
        buf = self._buffers(width)
        for name, value in (("ids", ids), ("positions", positions), ("mask", mask), ("starts", starts)):
            buf[name].copy_(value, non_blocking=True)
        if self.graphs:
            if width not in self.captured:
                self._capture(width, buf)
            self.captured[width].replay()
            x = buf["out"]
        else:
            x = self._run(buf)
        self.replays += 1
        target.num_forwards += 1
        return x[valid.to(x.device)]
