"""Cascade Speculative Drafting (CS Drafting, arXiv 2312.11462): drafters reviewed by drafters.

Levels are ordered big -> small, MaG (or any model-free drafter) last. The k-matrix K (upper
triangular, one row per level) says who drafts what:

- horizontal cascade: the block proposed to level i's reviewer is filled level by level; level j
  (j >= i) extends it until it holds K[i][i] + ... + K[i][j] tokens (quotas may be overshot);
- vertical cascade: a level that can review (a draft model: `review`) fills its share by reviewing
  the block that the levels below it propose (recursively, with K's sub-matrix from j + 1), i.e.
  it runs speculative decoding of its own: one forward over the sub-block accepts its greedy
  matches, or, with lenience l > 1, tokens it gives more than the proposer's probability / l, and
  appends its own argmax at the first rejection. A level that cannot review (prompt lookup, MaG, a
  feature head, Kangaroo) drafts its share itself.

The top reviewer is the target, through the decoder's own verifier: lenience never reaches it.
Inner reviews are greedy, so the whole cascade is a deterministic function of the context: its
proposal has q = one-hot (q_probs None) and speculative sampling on top stays lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import ComposedReads, Drafter, DraftRequest, draft_path, reads_target
from quickdraft.drafters.kinds import KINDS, DrafterKind, DrafterSpec, stage_dtype
from quickdraft.drafters.spec import parse_stage
from quickdraft.errors import QuickdraftError
from quickdraft.spec_options import number_at_least, parse_options, take_options
from quickdraft.verifiers.tree import TokenTree

GREEDY = SamplingConfig(temperature=0.0)


def k_rows(value: str) -> list[list[int]]:
    """`;k=`'s value: the k-matrix's rows from the diagonal joined by '/', entries by ',' (2,4/4)."""
    try:
        return [[int(x) for x in row.split(",")] for row in value.split("/")]
    except ValueError:
        raise ValueError("rows of integers, e.g. k=2,4/4") from None


CASCADE_OPTIONS = {"k": k_rows, "l": number_at_least(1)}


DEFAULT_CASCADE = "distilled>mag"


def default_k(levels: int) -> list[list[int]]:
    """Quotas when none are given: 2 tokens per model level, 4 for the last (model-free) level."""
    return [[2] * (levels - 1 - i) + [4] for i in range(levels)]


@dataclass(frozen=True)
class CascadeSpec:
    """A parsed `csd:` argument: levels (big -> small), k-matrix rows (from the diagonal), lenience."""

    levels: tuple[DrafterSpec, ...]
    k: tuple[tuple[int, ...], ...]
    lenience: float


def parse_cascade(arg: str | None) -> CascadeSpec:
    """`LEVELS[;k=ROWS][;l=L]`: LEVELS are drafter stages joined by '>' (big -> small, no '@DTYPE'),
    ROWS the k-matrix rows from the diagonal joined by '/', entries by ',' (e.g. k=2,4/4), L the
    lenience of inner reviews (default 1). Without an argument: DEFAULT_CASCADE."""
    text = arg or DEFAULT_CASCADE
    levels_text, own = take_options(text, ("k", "l"))  # a level's own options (;vocab=, ;quant=) stay its
    levels = tuple(parse_stage(stage, f"csd:{text}") for stage in levels_text.split(">") if stage)
    if len(levels) < 2 or any(level.kind == "csd" for level in levels):
        raise QuickdraftError(
            f"drafter 'csd:{text}': a cascade needs at least two levels (no nested csd), e.g. csd:distilled>mag"
        )
    _, values = parse_options(f"drafter 'csd:{text}'", ";".join(["", *own]), CASCADE_OPTIONS)
    k, lenience = values.get("k", default_k(len(levels))), values.get("l", 1.0)
    for i, row in enumerate(k):
        if len(row) != len(levels) - i or min(row) < 0 or sum(row) < 1:
            raise QuickdraftError(f"drafter 'csd:{text}': k-matrix row {i} needs {len(levels) - i} quotas >= 0")
    if len(k) not in (len(levels) - 1, len(levels)):
        raise QuickdraftError(f"drafter 'csd:{text}': the k-matrix needs {len(levels) - 1} or {len(levels)} rows")
    return CascadeSpec(levels, tuple(tuple(r) for r in k), lenience)


def check_k_matrix(k: Sequence[Sequence[int]], levels: int) -> list[list[int]]:
    """K as a full n x n list (row i: zeros before column i), or a clear error. Rows may be given
    from the diagonal (row i with n - i entries); the last level's row may be omitted."""
    rows = [list(r) for r in k]
    if len(rows) == levels - 1:
        rows.append([max(1, rows[-1][-1] if rows and rows[-1] else 1)])
    if len(rows) != levels:
        raise QuickdraftError(f"the k-matrix needs {levels - 1} or {levels} rows for {levels} levels, got {len(rows)}")
    full = []
    for i, row in enumerate(rows):
        row = row[i:] if len(row) == levels else row
        if len(row) != levels - i or min(row) < 0 or sum(row) < 1:
            raise QuickdraftError(f"k-matrix row {i} needs {levels - i} quotas >= 0 (not all 0), got {row}")
        full.append([0] * i + row)
    return full


class CascadeDrafter(ComposedReads):
    """CS Drafting over any of the project's drafters (levels big -> small).

    Args:
        levels: the drafters; those with `review(context, tokens)` can review the levels below.
        k_matrix: quotas (see module docstring), n x n or rows from the diagonal.
        lenience: l >= 1 for inner reviews (1 = strict greedy matching).

    Attributes:
        calls: forward calls per level since `begin` (the cost model's counters).
    """

    def __init__(self, levels: Sequence[Drafter], k_matrix, lenience: float = 1.0, name: str = "csd") -> None:
        if len(levels) < 2:
            raise QuickdraftError("a cascade needs at least two levels, e.g. csd:distilled>mag")
        if lenience < 1:
            raise QuickdraftError(f"cascade lenience must be >= 1, got {lenience}")
        self.levels, self.lenience, self.name = list(levels), float(lenience), name
        self.parts = self.levels  # ComposedReads: levels that read the target are bound and fed
        self.k = check_k_matrix(k_matrix, len(self.levels))
        if any(reads_target(level) for level in self.levels[1:]):
            raise QuickdraftError(
                "a drafter that reads the target's states (head, kangaroo, specdec) can only be a cascade's first level"
            )
        self.calls = [0] * len(self.levels)

    @property
    def block(self) -> int:
        """Tokens proposed to the target per round (before quotas are overshot)."""
        return sum(self.k[0])

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        self.calls = [0] * len(self.levels)
        for level in self.levels:
            level.begin(prompt_ids, budget)

    def step_seconds(self) -> float | None:
        """The first model level's step (the cascade's costliest drafter)."""
        costs = [c for d in self.levels if (c := d.step_seconds()) is not None]
        return costs[0] if costs else None

    def component_steps(self) -> list[int]:
        """Forward calls per level since `begin` (a reviewing level counts one per review)."""
        return list(self.calls)

    def review(self, j: int, context: list[int], proposal: list[tuple[int, float]]) -> list[tuple[int, float]]:
        """Level j reviews `proposal` ((token, proposer's probability) pairs) after `context`:
        its accepted prefix and one token of its own, each with level j's probability."""
        tokens = [t for t, _ in proposal]
        probs = torch.softmax(self.levels[j].review(context, tokens).float(), dim=-1)  # (m+1, V)
        self.calls[j] += 1
        out = []
        for i, (token, p_prop) in enumerate(proposal):
            r = probs[i]
            if token == int(r.argmax()) or (self.lenience > 1 and float(r[token]) > p_prop / self.lenience):
                out.append((token, float(r[token])))
                continue
            break
        r = probs[len(out)]
        best = int(r.argmax())
        return out + [(best, float(r[best]))]

    def generate(self, i: int, context: list[int], limit: int) -> list[tuple[int, float]]:
        """The block levels i.. propose after `context` (quotas from row i of K), at most `limit`."""
        out: list[tuple[int, float]] = []
        for j in range(i, len(self.levels)):
            quota = min(limit, sum(self.k[i][i : j + 1]))
            level = self.levels[j]
            while len(out) < quota:
                ctx = context + [t for t, _ in out]
                if reads_target(level) and out:
                    break  # a target-reading level drafts only from the committed context
                if j + 1 < len(self.levels) and level.can_review:
                    below = self.generate(j + 1, ctx, limit=sum(self.k[j + 1][j + 1 :]))
                    new = self.review(j, ctx, below)
                else:
                    drafted = level.propose(ctx, DraftRequest.chain(quota - len(out)), GREEDY, None).tokens
                    self.calls[j] += len(drafted)  # one step per token (a model-free level costs 0)
                    new = [(t, 1.0) for t in drafted]
                if not new:
                    break
                out += new
        return out[:limit]

    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """The cascade's block as a chain (deterministic: the verifiers treat q as one-hot)."""
        self.refuse_tree(request)
        if request.budget < 1:
            return TokenTree()
        return draft_path([t for t, _ in self.generate(0, list(context), min(request.budget, self.block))])


def _build(spec: DrafterSpec, target, dtype: str, runtime: str) -> CascadeDrafter:
    cascade = spec.value
    levels = [KINDS[level.kind].build(level, target, stage_dtype(level, dtype), runtime) for level in cascade.levels]
    return CascadeDrafter(levels, cascade.k, cascade.lenience, name=str(spec))


KIND = DrafterKind(
    name="csd",
    usage="csd[:LEVELS[;k=ROWS][;l=L]]",
    summary="a CS Drafting cascade over any of these, levels joined by '>' (default distilled>mag)",
    build=_build,
    parse_arg=parse_cascade,
    takes_dtype=True,
    has_model=False,
)
