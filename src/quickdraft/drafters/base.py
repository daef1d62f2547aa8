"""The Drafter base class: the protocol every drafter follows and the capabilities it declares.

A drafter proposes up to k tokens continuing the committed sequence. It owns whatever state it
needs (a model drafter owns its CachedModel) and reconciles that state with the committed sequence
at the start of every `propose` call, so decode loops never touch a drafter's cache and rejected or
never-fed drafts (the all-accepted off-by-one) are handled in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import logits_to_probs, sample
from quickdraft.types import Proposal

# Called with the draft's raw logits row (V,) after each drafted token; False stops the round.
KeepDrafting = Callable[[torch.Tensor], bool]


class Drafter:
    """The base of every drafter: the protocol, and the capabilities each drafter declares (the
    defaults here are a plain chain drafter's; decoders read these, never probe with hasattr).

    Attributes:
        name: labels statistics and reports.
        target_layers: the target states it reads (FEATURES or layer indices; empty: none).
        drafts_trees: it drafts token trees (`propose_tree`).
        can_review: it can review lower levels of a CS Drafting cascade (`review`).
        tree_gain: expected tokens per forward by tree budget, which sizes `draft_tree` auto (None:
            a chain).
        parts: the drafters it is built from (a chain's stages, a cascade's levels, a mixed tree's
            sources), for the cost model and the target-state wiring.
        draft_steps: its forwards since `begin` (the bench's cost model).
        runs_target_layers: l > 0 when its draft runs the target's own first l layers over the
            target's cache (Kangaroo): it is then given a handle on them (`bind`).
    """

    name: str = "drafter"
    target_layers: tuple[int, ...] = ()
    drafts_trees: bool = False
    can_review: bool = False
    tree_gain: dict[int, float] | None = None
    parts: Sequence[Drafter] = ()
    draft_steps: int = 0
    runs_target_layers: int = 0

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
        raise NotImplementedError

    def propose_tree(self, context: Sequence[int], shape, sampling: SamplingConfig, generator):
        """A token tree of at most `shape.budget` nodes continuing `context` (drafters with `drafts_trees`)."""
        raise QuickdraftError(f"drafter {self.name!r} cannot draft trees")

    def step_seconds(self) -> float | None:
        """Measured seconds of one draft step, or None when drafting costs next to nothing (no model).
        Used to size PEARL's window; may reset the drafter's state (call between generations)."""
        return None

    def bind(self, shallow) -> None:
        """Receive the handle on the target's first `runs_target_layers` layers over its cache
        (`models.native_cache.ShallowPass`; drafters with `runs_target_layers` only)."""

    def observe(self, states: dict[int, torch.Tensor]) -> None:
        """Receive the target's rows of the tokens its last forward committed (`target_layers`)."""

    def components(self) -> list[Drafter]:
        """The drafters whose forwards the cost model counts: the parts', else itself."""
        return [c for part in self.parts for c in part.components()] if self.parts else [self]

    def component_steps(self) -> list[int]:
        """Forward calls of each of `components()` since `begin`."""
        return [c.draft_steps for c in self.components()]


# A drafter that reuses the target declares which of the target's states it reads
# (`target_layers`: a layer index l = the state entering layer l, or FEATURES = the final-normed
# state the LM head reads). Every target forward returns those states (`types.TargetOutput`), and the
# decoder passes the drafter the rows of the tokens that forward committed, as an argument
# (`observe({layer: (m, H)})`, m = accepted drafts + 1, the whole prompt after prefill:
# `decoding/common.StateHandoff`). Kangaroo, whose draft is the target's own first layers over the
# target's own cache, is also given a handle on those layers (`bind`), never the cache owner.
FEATURES = -1


def reads_target(drafter: Drafter | None) -> bool:
    """Whether `drafter` consumes the target's hidden states (it then needs the native runtime)."""
    return drafter is not None and bool(drafter.target_layers)


def bind_target(drafter: Drafter | None, target) -> None:
    """Check that a target-reading drafter's target keeps states (the native runtime); a drafter that
    runs the target's own first layers (Kangaroo) gets a handle on them, never the cache owner."""
    if not reads_target(drafter):
        return
    if not target.reads_states:
        raise QuickdraftError(f"the {drafter.name} drafter reads the target's hidden states: use --runtime native")
    if drafter.runs_target_layers:
        drafter.bind(target.shallow_pass(drafter.runs_target_layers))


class ComposedReads(Drafter):
    """For drafters built from other drafters (`parts`: a chain's stages, a cascade's levels): the
    target states any part reads, the binding and the observed rows passed on to the parts that read."""

    @property
    def target_layers(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(layer for d in self.parts for layer in d.target_layers))

    @property
    def runs_target_layers(self) -> int:
        return next((d.runs_target_layers for d in self.parts if d.runs_target_layers), 0)

    def bind(self, shallow) -> None:
        for part in self.parts:
            if part.runs_target_layers == shallow.stop:
                part.bind(shallow)

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
    """The drafter's own measured cost of one draft step; None without a drafter and for model-free
    drafters."""
    return None if drafter is None else drafter.step_seconds()
