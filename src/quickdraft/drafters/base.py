"""The Drafter protocol.

A drafter proposes up to k tokens continuing the committed sequence. It owns whatever state it
needs (a model drafter owns its CachedModel) and reconciles that state with the committed sequence
at the start of every `propose` call, so decode loops never touch a drafter's cache and rejected or
never-fed drafts (the all-accepted off-by-one) are handled in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from quickdraft.config import SamplingConfig
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import logits_to_probs, sample
from quickdraft.types import Proposal

# Called with the draft's raw logits row (V,) after each drafted token; False stops the round.
KeepDrafting = Callable[[torch.Tensor], bool]


class Drafter(Protocol):
    """Proposes draft tokens. `name` labels statistics and reports."""

    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start a new sequence (drop state tied to an earlier one)."""

    def propose(
        self,
        context: Sequence[int],
        num_draft_tokens: int,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
    ) -> Proposal:
        """Propose up to `num_draft_tokens` tokens continuing `context` (the committed ids).

        In sampling mode a drafter with a distribution must sample each token from exactly the
        processed q it returns; deterministic drafters return q_probs=None.
        """
        ...

    def step_seconds(self) -> float | None:
        """Measured seconds of one draft step, or None when drafting costs next to nothing (no model).
        Used to size PEARL's window; may reset the drafter's state (call between generations)."""
        ...


# A drafter that reuses the target declares which of the target's states it reads
# (`target_layers`: a layer index l = the state entering layer l, or FEATURES = the final-normed
# state the LM head reads) and implements `bind(target)` and `observe(states)`. Decoders bind it to
# the target's cache owner once and, after every target forward, pass it the rows of the tokens that
# forward committed: {layer: (m, H)}, m = accepted drafts + 1 (the whole prompt after prefill).
FEATURES = -1


def reads_target(drafter: Drafter | None) -> bool:
    """Whether `drafter` consumes the target's hidden states (it then needs the native runtime)."""
    return bool(getattr(drafter, "target_layers", ()))


def bind_target(drafter: Drafter | None, target) -> tuple[int, ...]:
    """Give a target-reading drafter the target's cache owner; returns the layers to keep (the
    `keep_hidden` of the target's forwards), empty for every other drafter."""
    if not reads_target(drafter):
        return ()
    if not hasattr(target, "extend_shallow"):
        raise QuickdraftError(f"the {drafter.name} drafter reads the target's hidden states: use --runtime native")
    drafter.bind(target)
    return tuple(layer for layer in drafter.target_layers if layer != FEATURES)


def observe_target(drafter: Drafter | None, target, rows: int | Sequence[int]) -> None:
    """Pass rows of the target's last forward (the first `rows`, or those indices: a tree's root and
    accepted path) to a target-reading drafter."""
    if not reads_target(drafter):
        return
    pick = slice(0, rows) if isinstance(rows, int) else torch.tensor(list(rows), dtype=torch.long)
    states = {layer: target.hidden[layer][pick] for layer in drafter.target_layers if layer != FEATURES}
    if FEATURES in drafter.target_layers:
        states[FEATURES] = target.features[pick]
    drafter.observe(states)


class ComposedReads:
    """For drafters built from other drafters (`parts`: a chain's stages, a cascade's levels): the
    target states any part reads, the binding and the observed rows passed on to the parts that read."""

    parts: list

    @property
    def target_layers(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(layer for d in self.parts for layer in getattr(d, "target_layers", ())))

    def bind(self, target) -> None:
        for part in self.parts:
            if reads_target(part):
                part.bind(target)

    def observe(self, states: dict[int, torch.Tensor]) -> None:
        for part in self.parts:
            if reads_target(part):
                part.observe({layer: states[layer] for layer in part.target_layers})


def draft_token(logits: torch.Tensor, sampling: SamplingConfig, generator, q_rows: list) -> int:
    """One draft token from a (V,) logits row: argmax when greedy, else a sample of the processed q,
    appended to q_rows (verifiers need exactly the q each token was drawn from)."""
    if sampling.greedy:
        return int(logits.argmax())
    q = logits_to_probs(logits, sampling)  # (V,) float32
    q_rows.append(q)
    return int(sample(q, generator))


def empty_proposal() -> Proposal:
    return Proposal(tokens=torch.zeros(0, dtype=torch.long), q_probs=None)


def drafter_step_seconds(drafter: Drafter | None) -> float | None:
    """The drafter's own measured cost of one draft step; None without a drafter, for model-free
    drafters, and for drafters written before the protocol had `step_seconds`."""
    measure = getattr(drafter, "step_seconds", None)
    return measure() if measure is not None else None
