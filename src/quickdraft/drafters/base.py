"""The Drafter base class: the protocol every drafter follows and the capabilities it declares.

A drafter has one method for drafting: `propose(context, request, sampling, generator)` returns a
`TokenTree` continuing the committed sequence. A chain is a tree one node wide: asked for a chain
(`request.shape` None) a drafter returns a path of at most `request.budget` tokens
(`TokenTree.path`, carrying the q rows its tokens were sampled from); asked for a tree, a drafter
that `drafts_trees` returns a tree of at most that many nodes.

A drafter owns whatever state it needs (a model drafter owns its CachedModel) and reconciles that
state with the committed sequence at the start of every `propose` call, so decode loops never touch a
drafter's cache and rejected or never-fed drafts (the all-accepted off-by-one) are handled in one
place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.tree import TreeShape
from quickdraft.errors import QuickdraftError
from quickdraft.sampling import greedy, logits_to_probs, sample
from quickdraft.verifiers.tree import TokenTree

# Called with the draft's raw logits row (V,) after each drafted token and the chain's length so far
# (1 after its first token: a policy with per-chain state starts afresh); False stops the round.
KeepDrafting = Callable[[torch.Tensor, int], bool]
# Called with a greedy chain's draft probabilities at one position, (top-1, top-2), the position (1-based)
# and the rows the verify holds so far (the root, the chain and its siblings); True adds the top-2 token as
# a leaf beside the chain's token there (a sibling: no draft forward, one more verify row).
SiblingRule = Callable[[float, float, int, int], bool]


@dataclass(frozen=True)
class DraftRequest:
    """What one round asks of a drafter.

    Attributes:
        budget: the most draft nodes (a chain's length, a tree's node count).
        shape: the tree's shape (its budget equals `budget`), or None for a chain: a one-wide tree.
        keep_drafting: a chain's early stop (the draft-length policy), called after each token.
        siblings: where a greedy chain from a model drafter also offers its second choice (None:
            nowhere). The verify then holds a tree (the chain and leaves beside it), checked by the tree
            rule: deterministic drafts keep greedy decoding exact whatever the shape.
    """

    budget: int
    shape: TreeShape | None = None
    keep_drafting: KeepDrafting | None = None
    siblings: SiblingRule | None = None

    @classmethod
    def chain(
        cls, k: int, keep_drafting: KeepDrafting | None = None, siblings: SiblingRule | None = None
    ) -> DraftRequest:
        return cls(k, None, keep_drafting, siblings)

    @classmethod
    def tree(cls, shape: TreeShape) -> DraftRequest:
        return cls(shape.budget, shape)

    def within(self, room: int) -> DraftRequest:
        """The same request with at most `room` nodes (a draft with a shorter context near its end)."""
        budget = min(self.budget, room)
        if self.shape is None or budget < 1 or budget == self.shape.budget:
            return replace(self, budget=budget)
        return replace(self, budget=budget, shape=replace(self.shape, budget=budget))


class Drafter:
    """The base of every drafter: the protocol, and the capabilities each drafter declares (the
    defaults here are a plain chain drafter's; decoders read these, never probe with hasattr).

    Attributes:
        name: labels statistics and reports.
        target_layers: the target states it reads (FEATURES or layer indices; empty: none).
        drafts_trees: it drafts token trees (`propose` with a tree request), not only paths.
        can_review: it can review lower levels of a CS Drafting cascade (`review`).
        tree_gain: expected tokens per forward by tree budget, which sizes `draft_tree` auto (None:
            a chain).
        tree_gain_width: the tree width each budget of `tree_gain` was measured at, which auto
            uses with that budget (None: the configured width).
        pmin: (up to N tokens, stopped after one it gives top-1 probability < P): its default chain
            when no draft option is given (llama.cpp's p-min: an independent draft model's); None:
            fixed chains of draft_length.
        parts: the drafters it is built from (a chain's stages, a cascade's levels, a mixed tree's
            sources), for the cost model and the target-state wiring.
        draft_steps: its forwards since `begin` (the bench's cost model).
        runs_target_layers: l > 0 when its draft runs the target's own first l layers over the
            target's cache (Kangaroo): it is then given a handle on them (`bind`).
        drafts_ahead: a fork's `propose` depends on its context and the data forks share only (no
            draws, no target states), so a fork may draft for a guessed context while the target
            verifies (`decoding/ahead.py`).
    """

    name: str = "drafter"
    target_layers: tuple[int, ...] = ()
    drafts_trees: bool = False
    can_review: bool = False
    tree_gain: dict[int, float] | None = None
    tree_gain_width: dict[int, int] | None = None
    pmin: tuple[int, float] | None = None
    parts: Sequence[Drafter] = ()
    draft_steps: int = 0
    runs_target_layers: int = 0
    drafts_ahead: bool = False

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        """Start a new sequence (drop state tied to an earlier one) that adds at most `budget` tokens
        (None: not known)."""

    def end(self) -> None:
        """The sequence ended (a drafter that learns from finished text takes it here)."""

    def fork(self) -> Drafter | None:
        """A drafter for one more sequence drafted beside this one's (batched decoding: one per row),
        sharing its read-only data; None when it cannot (a model drafter owns one cache)."""
        return None

    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """Draft continuing `context` (the committed ids): a path of at most `request.budget` tokens
        for a chain request, a tree of at most that many nodes for a tree request (drafters with
        `drafts_trees`; the others refuse it with `refuse_tree`).

        In sampling mode a drafter with a distribution must sample each token from exactly the
        processed q it puts in the tree (`q_rows`); deterministic drafters put none.
        """
        raise NotImplementedError

    def refuse_tree(self, request: DraftRequest) -> None:
        """Raise when a chain-only drafter is asked for a tree."""
        if request.shape is not None:
            raise QuickdraftError(f"drafter {self.name!r} cannot draft trees")

    def step_seconds(self) -> float | None:
        """Measured seconds of one draft step, or None when drafting costs next to nothing (no model).
        Used to size PEARL's window; may reset the drafter's state (call between generations)."""
        return None

    def lookup_seconds(self) -> float | None:
        """Measured seconds a propose spends outside model forwards (index lookups, tree building),
        or None when that is negligible: the draft guard and the auto tree budget add it to every
        drafted round. A drafter built from parts: theirs, summed."""
        found = [s for s in (p.lookup_seconds() for p in self.parts) if s is not None]
        return sum(found) if found else None

    def bind(self, shallow) -> None:
        """Receive the handle on the target's first `runs_target_layers` layers over its cache
        (`models.native_cache.ShallowPass`; drafters with `runs_target_layers` only)."""

    def observe(self, states: dict[int, torch.Tensor]) -> None:
        """Receive the target's rows of the tokens its last forward committed (`target_layers`)."""

    def kv_bytes(self) -> int:
        """Bytes the drafter's own KV caches hold now (a draft model's; none for model-free drafters): its
        parts', summed."""
        return sum(p.kv_bytes() for p in self.parts)

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

    def end(self) -> None:
        for part in self.parts:
            part.end()

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
        return int(greedy(logits))
    q = logits_to_probs(logits, sampling)  # (V,) float32
    q_rows.append(q)
    return int(sample(q, generator))


def draft_path(
    tokens: Sequence[int], q_rows: Sequence[torch.Tensor] = (), shallow: torch.Tensor | None = None
) -> TokenTree:
    """A chain's draft as a one-wide tree: `q_rows` the (V,) rows its tokens were sampled from (none:
    deterministic), `shallow` the target's first-layer states of [last committed, tokens] (Kangaroo)."""
    if q_rows and len(q_rows) != len(tokens):
        raise QuickdraftError(f"{len(q_rows)} q rows for {len(tokens)} draft tokens")
    return TokenTree.path(list(tokens), torch.stack(list(q_rows)) if len(q_rows) else None, shallow)


def drafter_step_seconds(drafter: Drafter | None) -> float | None:
    """The drafter's own measured cost of one draft step; None without a drafter and for model-free
    drafters."""
    return None if drafter is None else drafter.step_seconds()
