"""The `Target` protocol: what every decode loop and drafter may ask of the model being sped up.

A target is one model and the one KV cache it owns. It runs new rows after the cached ones (at given
positions, under a mask over the new rows for token trees) and returns their logits and the states a
drafter asked for; it keeps the first n cached positions (`rollback`), and where it declares
`supports_trees`, keeps a chosen subset of the rows just added (`compact`). Decoders are typed
against this protocol, never against a class, so a backend is one file that implements it:

    native  `runtime/caches/native_cache.py` (NativeCachedModel): quickdraft's own forward (Llama family), trees
            and states
    hf      `runtime/caches/cached_model.py` (CachedModel): Hugging Face's forward, chains only
    (test)  `tests/numpy_target.py`: a numpy forward of a tiny Llama, trees included, proving the
            point: it passes the lossless suite through the same decoders

`load_target` is the one place a target is built from a loaded model (the engine and the PEARL
worker both call it): quantized linears, the runtime rule, the vocabulary cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from quickdraft.runtime.choose import cached_model
from quickdraft.runtime.quant.modes import QuantSpec
from quickdraft.runtime.quant.quantized import Quantized, quantize_model
from quickdraft.types import TargetOutput
from quickdraft.weights.loading import LoadedModel


class Target(Protocol):
    """One model and its KV cache, driven by decode loops.

    Attributes:
        runtime: the backend's name ("native", "hf", ...), reported in statistics.
        supports_trees: `forward` takes positions and a tree mask, and `compact` works.
        reads_states: `forward` returns hidden states (`keep_hidden`, `features`) and the target
            offers `shallow_pass` (Kangaroo); drafters that read the target need it.
        supports_batches: `runtime/caches/batched.BatchedTarget` can run several sequences over its forward
            (the target then offers `net`: `forward_batch`, its layer shapes and device).
        vocab_size: V, the columns of every logits row.
        tokens: the ids its cache holds, in order.
        num_forwards: forwards run so far (statistics).
    """

    runtime: str
    supports_trees: bool
    reads_states: bool
    supports_batches: bool
    vocab_size: int
    tokens: list[int]
    num_forwards: int

    @property
    def length(self) -> int:
        """Positions in the cache."""
        ...

    @property
    def max_length(self) -> int:
        """The model's context length."""
        ...

    def forward(
        self,
        tokens: Sequence[int],
        last_only: bool = False,
        positions: Sequence[int] | None = None,
        tree_mask: torch.Tensor | None = None,
        keep_hidden: Sequence[int] = (),
        shallow: torch.Tensor | None = None,
        features: bool = False,
    ) -> TargetOutput:
        """Append n new rows after the cached ones and return their (n, V) logits ((1, V) with
        last_only) and the states asked for. positions (n,) default to consecutive ones; tree_mask
        (n, n) bool says which new rows each new row sees (default causal)."""
        ...

    def extend(
        self,
        tokens: Sequence[int],
        last_only: bool = False,
        positions: Sequence[int] | None = None,
        tree_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`forward`'s logits."""
        ...

    def prefill(self, tokens: Sequence[int]) -> torch.Tensor:
        """Reset, run the prompt, return (1, V) logits of its last row."""
        ...

    def sync(self, context: Sequence[int], last_only: bool = True) -> torch.Tensor:
        """Make the cache hold `context` (longest common prefix kept) and return its last logits."""
        ...

    def rollback(self, length: int) -> None:
        """Keep the first `length` cached positions."""
        ...

    def reset(self) -> None:
        """Empty the cache."""
        ...

    def twin(self) -> Target:
        """A second owner of the same weights with its own empty cache (a model drafter forked for
        one more sequence of a batch)."""
        ...

    def compact(self, keep: Sequence[int]) -> None:
        """Keep rows `keep` (increasing indices into the last forward's rows) of the last forward,
        moved to follow the context: a tree's accepted path (only where `supports_trees`)."""
        ...


@dataclass(frozen=True)
class TargetInfo:
    """What ran, as statistics and metrics report it: the model's name, its weights (dtype and
    quantization), the runtime and the device."""

    name: str
    weights: str
    runtime: str
    device: str

    def to_dict(self) -> dict[str, str]:
        return {"target": self.name, "weights": self.weights, "runtime": self.runtime, "device": self.device}


@dataclass
class LoadedTarget:
    """A built target, the quantized linears it runs on (None: the loaded weights) and what runs."""

    target: Target
    quantized: Quantized | None
    info: TargetInfo


def load_target(loaded: LoadedModel, runtime: str = "auto", quant: QuantSpec | None = None) -> LoadedTarget:
    """The target for a loaded model (on the device it is on): its linears quantized as `quant` asks
    (`EngineConfig.quant`, parsed at the edge; native runtime only), on the forward `runtime` picks
    (auto: native where it applies, else Hugging Face's)."""
    quantized = quantize_model(loaded, quant) if quant is not None and quant.active else None
    linears = quantized.linears if quantized is not None else None
    target = cached_model(loaded.model, loaded.vocab_size, runtime=runtime, linears=linears)
    dtype = str(loaded.model.dtype).removeprefix("torch.")
    weights = str(quantized.spec) if quantized is not None else dtype
    info = TargetInfo(loaded.name or str(loaded.source or "?"), weights, target.runtime, loaded.model.device.type)
    return LoadedTarget(target, quantized, info)
