"""The method registry: method name -> how its decoder is built, which options it reads.

Every decoder has `name`, `lossy` and `rounds(prompt_ids, sampling, max_new_tokens, generators)`
yielding one `Round` per target forward; a decoder holding processes or threads also has `close()`.
The Engine looks a method up here and never switches on its name; the CLI, the server and the bench
take their method lists from here. Adding a method: a decoder class and one `Method` row.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from quickdraft.config import DraftConfig, SamplingConfig
from quickdraft.costs.timing import step_seconds
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.decoding.autoregressive import Autoregressive
from quickdraft.decoding.guard import DraftGuard
from quickdraft.decoding.pearl import DEFAULT_GAMMA, PearlConfig, PearlDecoder, gamma_from_costs
from quickdraft.decoding.vanilla import SpeculativeDecoder
from quickdraft.drafters.base import Drafter, drafter_step_seconds, reads_target
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.target import Target
from quickdraft.verifiers import make_verifier


class DecodeOptions(Protocol):
    """What decoders read of the engine's options (`options.EngineConfig` is one). A protocol, so
    this module never imports the options module, which imports it for the method table."""

    drafter: str
    drafter_stages: tuple  # the parsed `drafter` (drafters.kinds.DrafterSpec stages)
    draft: DraftConfig
    verifier: str | None
    pearl: PearlConfig
    dtype: str
    runtime: str
    quantize: str


@dataclass
class DecodeParts:
    """What decoders are built from: the target's cache owner, the drafter, the options, a per-engine
    memo of what is measured once (PEARL's gamma, the tree budget) and what a decoder started once
    and `close` stops (PEARL's worker processes)."""

    target: Target
    drafter: Drafter | None
    config: DecodeOptions
    target_name: str | None = None
    memo: dict = field(default_factory=dict)
    started: dict = field(default_factory=dict)  # name -> an object with close()

    def close(self) -> None:
        """Stop whatever a decoder started (worker processes)."""
        for value in list(self.started.values()):
            value.close()
        self.started.clear()
        self.memo.clear()


def pearl_gamma(parts: DecodeParts, parallel: bool | None = None) -> int:
    """PEARL's window: the configured one, else measured once per engine (target step / draft step:
    drafting gamma tokens takes one target forward, which hides it behind the forward in two
    processes). In one process the halves run one after the other, so every drafted token adds its
    step to the round: there the window is capped at DEFAULT_GAMMA (the measured window, about 8 for
    the distilled draft, ran at 0.59x plain decoding; 4 at 0.81x; docs/benchmarks.md)."""
    if parts.config.pearl.gamma is not None:
        return parts.config.pearl.gamma
    if "pearl_gamma" not in parts.memo:
        parts.memo["pearl_gamma"] = gamma_from_costs(step_seconds(parts.target), drafter_step_seconds(parts.drafter))
    parallel = parts.config.pearl.parallel if parallel is None else parallel
    return parts.memo["pearl_gamma"] if parallel else min(DEFAULT_GAMMA, parts.memo["pearl_gamma"])


def parallel_pays(parts: DecodeParts) -> tuple[bool, str]:
    """(whether PEARL in two processes beats one, the measured reason), once per engine. A round of
    gamma drafts and one verify costs max(T_half, gamma D_half) in two processes (the target's step
    on its half of the cores, the draft's on the rest) and T_all + gamma D_all in one (both steps with
    every core), with the same acceptance: measured here, not assumed (2 cores halve each step's
    threads)."""
    if "pearl_parallel_pays" not in parts.memo:
        import torch

        from quickdraft.decoding.pearl_parallel import split_cores

        gamma, threads = pearl_gamma(parts, parallel=True), torch.get_num_threads()
        t_all, d_all = step_seconds(parts.target), drafter_step_seconds(parts.drafter) or 0.0
        target_cores, draft_cores = split_cores()
        try:
            torch.set_num_threads(len(target_cores))
            t_half = step_seconds(parts.target)
            torch.set_num_threads(len(draft_cores))
            d_half = drafter_step_seconds(parts.drafter) or 0.0
        finally:
            torch.set_num_threads(threads)
        two, one = max(t_half, gamma * d_half), t_all + gamma * d_all
        why = f"a round of {gamma} drafts: {two * 1e3:.1f} ms in two processes, {one * 1e3:.1f} ms in one"
        parts.memo["pearl_parallel_pays"] = (two < one, why)
    return parts.memo["pearl_parallel_pays"]


def _ar(parts: DecodeParts, sampling: SamplingConfig):
    return Autoregressive(parts.target)


def host_costs(parts: DecodeParts) -> tuple[dict[int, float], float | None, float]:
    """(this host's verify-cost curve for the target, a model drafter's step in target steps or None
    for a model-free drafter, the drafter's lookups a round in target steps), measured once per
    engine (the curve once per host for the shipped default). Only targets that verify trees (the
    native runtime) have a curve."""
    if "host_costs" not in parts.memo:
        from quickdraft.costs.cost_curve import cost_curve
        from quickdraft.weights.delta import SHIPPED_FOR

        name = parts.target_name or ""
        curve = cost_curve(
            parts.target, name, parts.config.dtype, persist=name in SHIPPED_FOR, weights=parts.config.quantize
        )
        draft_step = drafter_step_seconds(parts.drafter)
        lookup = None if parts.drafter is None else parts.drafter.lookup_seconds()
        step = step_seconds(parts.target) if draft_step is not None or lookup is not None else 1.0
        ratio = None if draft_step is None else draft_step / step
        parts.memo["host_costs"] = (curve, ratio, 0.0 if lookup is None else lookup / step)
    return parts.memo["host_costs"]


def draft_cost(parts: DecodeParts, chain: bool) -> Callable[[int], float]:
    """nodes drafted -> what drafting them costs, in one-row target steps: a model drafter's
    forwards at their measured step (one per chain token; one per expanded level of a tree), plus
    the drafter's measured lookups (a suffix drafter's index search and tree building) once a
    drafted round."""
    from quickdraft.costs.cost_curve import tree_draft_forwards

    _, ratio, lookup = host_costs(parts)

    def cost(nodes: int) -> float:
        if not nodes:
            return 0.0
        forwards = (
            0.0 if ratio is None else ratio * (nodes if chain else tree_draft_forwards(nodes, auto_width(parts, nodes)))
        )
        return forwards + lookup

    return cost


def round_cost(parts: DecodeParts, chain: bool) -> Callable[[int, int], float]:
    """(rows verified, nodes drafted) -> a round's cost in one-row target steps on this host: the
    verify forward from the curve plus drafting (`draft_cost`)."""
    from quickdraft.costs.cost_curve import relative_cost

    curve = host_costs(parts)[0]
    drafting = draft_cost(parts, chain)
    return lambda rows, nodes: relative_cost(curve, rows) + drafting(nodes)


def auto_tree_budget(parts: DecodeParts, sampling: SamplingConfig) -> tuple[int, dict[str, int]]:
    """(budget, events) for `draft_tree` auto: a drafter with a gain table (expected tokens per
    forward by budget: the suffix drafter's, a trained head's) gets the budget that maximises
    expected tokens per second on this host's measured verify-cost curve (costs/cost_curve.py),
    counting a model drafter's own forwards at their measured cost, once per engine; every other
    drafter, a target without tree support (the HF runtime) and the lossy verifiers get a chain
    (budget 0). The events say which, in the statistics."""
    gain = None if parts.drafter is None else parts.drafter.tree_gain
    if not gain:
        return 0, {}
    if not parts.target.supports_trees or parts.config.verifier not in (None, "greedy", "speculative"):
        return 0, {"tree_auto_fallback_chain": 1}
    if "tree_budget" not in parts.memo:
        from quickdraft.costs.cost_curve import best_budget

        curve = host_costs(parts)[0]
        parts.memo["tree_budget"] = best_budget(curve, gain, draft_cost=draft_cost(parts, chain=False))
    budget = parts.memo["tree_budget"]
    return budget, {"tree_budget_auto": budget} if budget else {"tree_auto_no_speculation": 1}


def with_guard(decoder, parts: DecodeParts, chain: bool, sampling: SamplingConfig):
    """Attach the draft guard (`decoding/guard.py`: plain rounds while drafting measurably loses on
    this host's costs, probes later) to a decoder with a `guard` slot (the speculative loop,
    one-process PEARL, priced as a chain) unless `--no-guard`; targets without a cost curve (the HF
    runtime) run unguarded. Greedy generations share one guard per engine, so its verdict carries
    from one request to the next (their tokens do not depend on it); a sampled one starts its own."""
    if parts.config.draft.guard and parts.target.supports_trees:
        if sampling.greedy:
            key = ("guard", type(decoder).__name__, chain)
            if key not in parts.memo:
                parts.memo[key] = DraftGuard(round_cost(parts, chain), carries=True)
            decoder.guard = parts.memo[key]
        else:
            decoder.guard = DraftGuard(round_cost(parts, chain))
    return decoder


def auto_width(parts: DecodeParts, budget: int) -> int:
    """The tree width that goes with an auto budget: the one the drafter's gain table measured it
    at (a trained head's narrow trees at small budgets), else the configured width."""
    widths = parts.drafter.tree_gain_width if parts.drafter is not None else None
    return (widths or {}).get(budget, parts.config.draft.tree_width)


def _sd(parts: DecodeParts, sampling: SamplingConfig):
    draft = parts.config.draft
    budget, events = (draft.tree, {}) if draft.tree is not None else auto_tree_budget(parts, sampling)
    if "tree_auto_no_speculation" in events:  # no budget beats plain decoding on this host
        return Autoregressive(parts.target, events)
    if budget > 0:
        if parts.config.verifier not in (None, "greedy" if sampling.greedy else "speculative"):
            raise QuickdraftError("token trees verify with the lossless rule only; drop --verifier")
        from quickdraft.decoding.tree import TreeDecoder
        from quickdraft.drafters.tree import TreeShape

        width = draft.tree_width if draft.tree is not None else auto_width(parts, budget)
        shape = TreeShape(budget, width, draft.tree_widths)
        return with_guard(TreeDecoder(parts.target, parts.drafter, shape, events), parts, False, sampling)
    verifier = make_verifier(parts.config.verifier, sampling)
    decoder = SpeculativeDecoder(
        parts.target, parts.drafter, verifier, lambda: make_draft_policy(parts.config.draft), events
    )
    return with_guard(decoder, parts, True, sampling)


def _pearl(parts: DecodeParts, sampling: SamplingConfig):
    from quickdraft.drafters.kinds import KINDS

    if reads_target(parts.drafter) or any(KINDS[stage.kind].reads_target for stage in parts.config.drafter_stages):
        readers = ", ".join(k.name for k in KINDS.values() if k.reads_target)
        raise QuickdraftError(
            "PEARL drafts while the target runs, so a drafter that reads the target's states "
            f"({readers}) cannot run under it; use --method sd"
        )
    verifier = make_verifier(parts.config.verifier, sampling)  # refuses bad combinations here, not in a worker
    if verifier.reads_logits:
        raise QuickdraftError(f"PEARL verifies with greedy, speculative or lenient rules, not {verifier.name}")
    declined = parts.config.pearl.parallel and parts.config.draft.guard and not parallel_pays(parts)[0]
    if declined and "pearl_declined" not in parts.memo:  # said once per engine; --no-guard forces it
        print(f"quickdraft: --parallel declined: {parallel_pays(parts)[1]}", file=sys.stderr)
        parts.memo["pearl_declined"] = True
    if not parts.config.pearl.parallel or declined:
        events = {"pearl_parallel_declined": 1} if declined else {}
        gamma = pearl_gamma(parts, parallel=False)
        decoder = PearlDecoder(parts.target, parts.drafter, verifier, parts.config.pearl, gamma, events)
        return with_guard(decoder, parts, True, sampling)  # its halves run one after the other
    if "pearl_parallel" not in parts.started:
        from quickdraft.decoding.pearl_parallel import ParallelPearl, ParallelSpec, split_cores

        cfg = parts.config
        spec = ParallelSpec(
            parts.target_name, cfg.drafter, cfg.dtype, cfg.pearl, cfg.verifier, split_cores(), cfg.runtime, cfg.quantize
        )
        parts.started["pearl_parallel"] = ParallelPearl(spec)
    return parts.started["pearl_parallel"].decoder(verifier)


@dataclass(frozen=True)
class Method:
    """A decoding method: its decoder builder, whether it drafts, the options it reads (beyond the
    model's: target, dtype, threads), whether many sequences can run it in one batch
    (`decoding/batch.py`) and whether it runs on the CPU only."""

    name: str
    help: str
    build: Callable[[DecodeParts, SamplingConfig], object]
    uses_drafter: bool
    options: tuple[str, ...]
    batches: bool = False
    cpu_only: bool = False


_DRAFT = (
    "drafter",
    "guard",
    "draft_length",
    "draft_schedule",
    "confidence_threshold",
    "draft_tree",
    "tree_width",
    "tree_shape",
    "verifier",
)
METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("ar", "plain autoregressive decoding (the baseline)", _ar, False, (), batches=True),
        Method("sd", "speculative decoding", _sd, True, _DRAFT, batches=True),
        Method(
            "pearl",
            "PEARL: the draft keeps drafting while the target verifies",
            _pearl,
            True,
            ("drafter", "guard", "verifier", "gamma", "pre_verify", "post_verify", "parallel"),
            cpu_only=True,  # its parallel runner pins CPU cores; CUDA streams are not built
        ),
    )
}
