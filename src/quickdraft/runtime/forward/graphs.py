"""Static shapes for the batched forward, and CUDA graphs over them (issue #27).

On a GPU a small model's forward waits on kernel launches, not on memory: a CUDA graph replays the
whole forward's kernels as one launch, but only over fixed buffers and shapes. So the batched
forward (`runtime/caches/batched.py`) is made static here:
- every slot of the batch cache runs (idle slots write to their own unused positions and see only
  themselves), and the new rows of each row are padded to a width bucket (1, 2, 4, ..., 64);
- attention reads a span bucket of the cache (256, 512, ... positions, up to its preallocated
  capacity: the smallest that holds the longest row and its new rows) under a mask, which is an
  input buffer, as are the ids, positions and each row's write position. Reading the whole capacity
  (8192 positions for the default model) made attention a large share of a verify (issue #50's
  profile, docs/gpu.md); a span bucket reads what the context needs;
- one graph per (width, span) bucket, all captured when the engine makes the decoder (`prepare`,
  issue #70: every width its drafts can take, every span up to the capacity, largest first into one
  shared pool; `capture.py`), so no timed generation pays a capture; a bucket met later is captured
  then (counted late); each is replayed after the round's inputs are copied in;
- a batch of one (a lone request) runs its LM head inside the graph too (its rows are all real or
  few); a wider batch runs the LM head over the rows that are not padding, after the graph;
- nothing is read back from the device: the real rows are picked by an index made on the host;
- plain greedy decoding of a lone request (`greedy_chain`) feeds each step's argmax to the next step
  on the device: one graph per span bucket runs the forward, the LM head, the argmax and the next
  step's inputs, and up to CHAIN_AHEAD steps are in flight while the host reads the tokens behind
  them, so the host's launch and Python overlap the GPU's step instead of following it.

`QUICKDRAFT_COMPILE=1` (an experiment, CUDA only) runs the forward through `torch.compile` before it
is captured, to measure what fusing a layer's elementwise kernels would give (a captured step's time
is its kernel count: docs/gpu.md).

With `graphs=False` (a CPU, or a GPU with graphs switched off) the same static computation runs
eagerly: that is the path the CPU tests compare with the dynamic forward (equal logits in float64).
`emulate=True` records `capture.EagerGraph`s on a CPU (a replay reruns the step into the outputs of
its capture), so what surrounds a capture is tested there too; only the CUDA capture itself is left
to `scripts/gpu_check.sh`. A width beyond the last bucket, or a
row too long for the capacity, takes the dynamic forward.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence

import torch

from quickdraft.runtime.caches.batched import BatchedTarget, RowBlock, block_inputs, pick_rows
from quickdraft.runtime.forward.capture import Capturer
from quickdraft.sampling import greedy

WIDTHS = (1, 2, 4, 8, 16, 32, 64)
FIRST_SPAN = 256  # the smallest span bucket; each next one doubles, the last is the capacity
CHAIN_AHEAD = 4  # greedy_chain: steps in flight on a GPU ahead of the token the host reads


class StaticBatchForward:
    """The static (and, on CUDA, graphed) forward of a `BatchedTarget`.

    Args:
        target: the batched target (its cache is grown to `capacity` once, here).
        capacity: positions per row, preallocated (at most the model's context).
        graphs: capture CUDA graphs (default: when the model is on a CUDA device).
        emulate: capture `capture.EagerGraph`s instead (a CPU: the tests).
    """

    def __init__(self, target: BatchedTarget, capacity: int, graphs: bool | None = None, emulate: bool = False) -> None:
        device = target.net.device
        self.cuda = (device.type == "cuda" if graphs is None else graphs) and not emulate  # CUDA graphs
        if self.cuda and device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self.graphs = self.cuda or emulate  # captured and replayed (emulated: `capture.EagerGraph`)
        self.capturer = Capturer(emulate) if self.graphs else None
        self.target = target
        target.cache.ensure(min(capacity, target.cache.limit))
        self.capacity = target.cache.capacity
        self.head_inside = target.max_batch == 1  # the LM head in the graph: a lone request's rows
        self.forward = target.net.forward_batch
        if self.cuda and os.environ.get("QUICKDRAFT_COMPILE") == "1":
            self.forward = torch.compile(self.forward, dynamic=False)
        self.inputs: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.captured: dict[tuple[int, int], object] = {}  # (width, span) -> its graph
        self.pinned: dict[tuple[int, int], tuple[dict[str, torch.Tensor], torch.cuda.Event | None]] = {}
        self.chains: dict[int, tuple[object, torch.Tensor]] = {}  # span -> its chain step's graph, next id
        self.replays = 0
        self.chain_steps = 0  # greedy_chain's steps (each one forward)

    def _stage(self, key: tuple[int, int], buf: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> None:
        """Copy a round's inputs (host tensors) into the key's device buffers. On CUDA they pass through
        pinned host buffers of the same shapes (a pageable source makes each copy a staged, blocking
        one); an event recorded after the copies guards those buffers until the copies have run."""
        if not self.cuda:
            for name, value in values.items():
                buf[name].copy_(value)
            return
        if key not in self.pinned:
            self.pinned[key] = ({n: torch.empty_like(v, device="cpu").pin_memory() for n, v in values.items()}, None)
        host, copied = self.pinned[key]
        if copied is not None:
            copied.synchronize()  # the last round's copies from these buffers (long done: a round reads back)
        for name, value in values.items():
            host[name].copy_(value)
            buf[name].copy_(host[name], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pinned[key] = (host, event)

    @staticmethod
    def bucket(width: int) -> int | None:
        return next((w for w in WIDTHS if w >= width), None)

    def span(self, needed: int) -> int:
        """The span bucket that holds `needed` positions: FIRST_SPAN doubled, at most the capacity."""
        span = FIRST_SPAN
        while span < needed:
            span *= 2
        return min(span, self.capacity)

    def spans(self) -> list[int]:
        """Every span bucket, smallest first: FIRST_SPAN doubled up to the capacity."""
        spans = [self.span(1)]
        while spans[-1] < self.capacity:
            spans.append(self.span(spans[-1] + 1))
        return spans

    @torch.inference_mode()
    def prepare(self, max_width: int = WIDTHS[-1]) -> None:
        """Capture every graph a generation can meet, before any runs (issue #70): each (width, span)
        bucket up to `max_width` new rows a row and the capacity, and a lone request's chain step for
        each span; largest first (smaller graphs reuse the shared pool's memory). A capture runs over
        idle rows (each writes its own first positions and sees only itself), so no row may be running.
        Nothing to do without graphs. Later captures count as late (`capturer.late`)."""
        if not self.graphs:
            return
        if self.target.rows:
            raise ValueError("prepare: rows are running (captures write the cache's first positions)")
        top = self.bucket(min(max(1, max_width), WIDTHS[-1]))
        slots = self.target.max_batch
        starts = torch.zeros(slots, dtype=torch.long)
        for span in reversed(self.spans()):
            if self.head_inside and span not in self.chains:
                self._chain_buffers(span, 0, 0, None)
            for width in reversed([w for w in WIDTHS if w <= top and w < self.capacity]):  # others run dynamic
                key = (width, span)
                if key in self.captured:
                    continue
                ids, positions, mask, _ = block_inputs([RowBlock([0])] * slots, starts, width, span)
                buf = self._buffers(key)
                self._stage(key, buf, {"ids": ids, "positions": positions, "mask": mask, "starts": starts})
                self._capture(key, buf)
        self.capturer.warm = True

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
        """The (width, span) bucket's graph over its staged buffers, its outputs kept in `buf["out"]`."""
        self.captured[key], buf["out"] = self.capturer(lambda: self._run(buf), _inputs(buf))

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
        self._stage(key, buf, {"ids": ids, "positions": positions, "mask": mask, "starts": starts})
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

    # --- plain greedy decoding fed on the device ----------------------------------------------
    def _chain_step(self, buf: dict[str, torch.Tensor]) -> torch.Tensor:
        """One plain step of the lone row over `buf` (width 1), then the next step's inputs made on the
        device: its id (this step's argmax), position and start one further, and the mask column of
        its own position. Returns the (1,) next id."""
        _, logits = self._run(buf)
        nxt = greedy(logits)  # (1,) the first of equal maxima, as the round loop picks
        buf["ids"].copy_(nxt.view(1, 1))
        buf["positions"].add_(1)
        buf["starts"].add_(1)
        span = buf["mask"].shape[-1]  # past the bucket's end, the next bucket's buffers set the column
        buf["mask"][0, 0].index_fill_(0, buf["starts"].clamp(max=span - 1), True)
        return nxt

    def _chain_buffers(self, span: int, token: int, at: int, held: dict[str, torch.Tensor] | None):
        """The (1, span) buffers set for a step at position `at`: from the host (`token`), or on the
        device from the buffers of the span bucket below (`held`), whose next step is already there."""
        buf = self._buffers((1, span))
        if held is None:
            buf["ids"].fill_(token)
            buf["positions"].fill_(at)
            buf["starts"].fill_(at)
            buf["mask"].zero_()
            buf["mask"][0, 0, : at + 1] = True
        else:
            for name in ("ids", "positions", "starts"):
                buf[name].copy_(held[name])
            buf["mask"].zero_()
            buf["mask"][..., : held["mask"].shape[-1]].copy_(held["mask"])
            buf["mask"][0, 0].index_fill_(0, buf["starts"], True)  # its own column, past the held bucket
        if self.graphs and span not in self.chains:
            self.chains[span] = self.capturer(lambda: self._chain_step(buf), _inputs(buf))
        return buf

    @torch.inference_mode()
    def greedy_chain(self, token: int, limit: int, take: Callable[[int], bool]) -> tuple[int, int]:
        """Plain greedy decoding of a batch of one, each step's next token fed to the next on the device.

        Args:
            token: the last committed id (the cache holds the row's context before it).
            limit: the most steps to run.
            take: gets each step's next id, in order; False: stop (EOS, a stop string, a budget).

        On CUDA a step is one graph replay (`_chain_step`) and up to CHAIN_AHEAD steps run ahead of the
        token the host reads (one device read a token, nothing else); a CPU runs the same steps eagerly.
        Steps issued past the last token taken wrote cache positions beyond the row's length, which
        stay free: the row's length ends at the tokens taken. Returns (steps issued, tokens taken).
        """
        target = self.target
        if target.max_batch != 1 or target.rows != 1:
            raise ValueError("greedy_chain runs a batch of one with its row admitted")
        length, ahead = target.cache.lengths[0], (CHAIN_AHEAD if self.graphs else 1)
        limit = min(limit, self.capacity - length)
        pending: deque[tuple[torch.Tensor, torch.cuda.Event | None]] = deque()
        ring = torch.empty(ahead + 1, dtype=torch.long, pin_memory=self.cuda) if self.graphs else None
        issued = taken = span = 0
        buf: dict[str, torch.Tensor] | None = None
        going = True
        while going and (pending or issued < limit):
            while issued < limit and len(pending) < ahead:
                at = length + issued
                if self.span(at + 1) != span:  # the row grew into the next span bucket (or starts)
                    span = self.span(at + 1)
                    buf = self._chain_buffers(span, token, at, buf)
                if self.graphs:
                    graph, nxt = self.chains[span]
                    graph.replay()
                    slot = ring[issued % (ahead + 1)].view(1)  # read once `done` has passed, never reused before
                    slot.copy_(nxt, non_blocking=self.cuda)
                    done = torch.cuda.Event() if self.cuda else None
                    if done is not None:
                        done.record()
                    pending.append((slot, done))
                else:
                    pending.append((self._chain_step(buf), None))
                issued += 1
            value, done = pending.popleft()
            if done is not None:
                done.synchronize()  # this step's token only: the steps behind it keep running
            going = take(int(value))
            taken += 1
        target.cache.lengths[0] = length + taken
        target.num_forwards += issued
        self.chain_steps += issued
        return issued, taken


def _inputs(buf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A bucket's input buffers (not its outputs): what a capture puts back after its warm-up."""
    return {name: buf[name] for name in ("ids", "positions", "mask", "starts")}
