"""The method registry: method name -> how its decoder is built, which options it reads.

Every decoder has `name`, `lossy` and `rounds(prompt_ids, sampling, max_new_tokens, generators)`
yielding one `Round` per target forward; a decoder holding processes or threads also has `close()`.
The Engine looks a method up here and never switches on its name; the CLI, the server and the bench
take their method lists from here. Adding a method: a decoder class and one `Method` row.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

from quickdraft.config import DraftConfig, SamplingConfig
from quickdraft.costs.timing import step_seconds
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.decoding.autoregressive import Autoregressive
from quickdraft.decoding.guard import DraftGuard
from quickdraft.decoding.parts import (
    DecodeParts,
    auto_width,
    draft_cost,
    drafting,
    host_costs,
    round_cost,
)
from quickdraft.decoding.pearl import DEFAULT_GAMMA, PearlDecoder, gamma_from_costs
from quickdraft.decoding.vanilla import SpeculativeDecoder
from quickdraft.drafters.base import drafter_step_seconds, reads_target
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers import make_verifier


def pearl_gamma(parts: DecodeParts, parallel: bool | None = None) -> int:
    """PEARL's window: the configured one, else measured once per engine (target step / draft step:
    drafting gamma tokens takes one target forward, which hides it behind the forward in two
    processes). In one process the halves run one after the other, so every drafted token adds its
    step to the round: there the window is capped at DEFAULT_GAMMA (the measured window, about 8 for
    the distilled draft, ran slower than a window of 4 there; docs/benchmarks.md)."""
    if parts.config.pearl.gamma is not None:
        return parts.config.pearl.gamma
    if "pearl_gamma" not in parts.memo:
        ratio = drafting(parts)[0]  # a draft step in target steps (None: a model-free drafter)
        parts.memo["pearl_gamma"] = gamma_from_costs(1.0, ratio)
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


def auto_chain(parts: DecodeParts) -> tuple[DraftConfig, dict[str, int]]:
    """(the chain `sd` drafts, and by whose schedule PEARL's window stops; events): the configured
    draft, or, when every draft option is left at its default (`draft_tree` auto: `options_from` makes
    it 0 once a length or schedule is given) and the drafter has no gain table, a draft model's auto
    chain (`Drafter.pmin`: up to N tokens): priced by this host's costs (the "cost" schedule) where
    the target has a verify-cost curve, else stopped after a token it gives top-1 probability < P."""
    draft, d = parts.config.draft, DraftConfig  # its defaults (class attributes of the dataclass)
    chain = (draft.num_draft_tokens, draft.schedule, draft.confidence_threshold)
    if draft.tree is not None or chain != (d.num_draft_tokens, d.schedule, d.confidence_threshold):
        return draft, {}
    if parts.drafter is None or parts.drafter.pmin is None or parts.drafter.tree_gain:
        return draft, {}
    length, threshold = parts.drafter.pmin
    schedule = "cost" if parts.target.supports_trees else "confidence"
    config = replace(draft, num_draft_tokens=length, schedule=schedule, confidence_threshold=threshold, tree=0)
    return config, {"draft_pmin_auto": length}


def draft_policy(parts: DecodeParts, draft: DraftConfig):
    """A fresh draft-length policy for `draft`; the "cost" schedule priced as the draft guard prices a
    chain's round (measured only for it: a fixed chain with the guard off measures nothing; a target
    without a curve, not the native runtime, gets no price and the schedule is refused)."""
    priced = draft.schedule == "cost" and parts.target.supports_trees
    return make_draft_policy(draft, round_cost(parts, True) if priced else None)


def _sd(parts: DecodeParts, sampling: SamplingConfig):
    draft, chain_events = auto_chain(parts)
    budget, events = (draft.tree, {}) if draft.tree is not None else auto_tree_budget(parts, sampling)
    events = {**chain_events, **events}
    if "tree_auto_no_speculation" in events:  # no budget beats plain decoding on this host
        return Autoregressive(parts.target, events)
    if budget > 0:
        if parts.config.verifier not in (None, "greedy" if sampling.greedy else "speculative"):
            raise QuickdraftError("token trees verify with the lossless rule only; drop --verifier")
        from quickdraft.drafters.tree import TreeShape

        width = draft.tree_width if draft.tree is not None else auto_width(parts, budget)
        shape = TreeShape(budget, width, draft.tree_widths)
        return with_guard(SpeculativeDecoder.tree(parts.target, parts.drafter, shape, events), parts, False, sampling)
    verifier = make_verifier(parts.config.verifier, sampling)
    decoder = SpeculativeDecoder(parts.target, parts.drafter, verifier, lambda: draft_policy(parts, draft), events)
    decoder.siblings = decoder.siblings and parts.config.draft.siblings
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
        draft, events = auto_chain(parts)  # a confidence schedule (the p-min default) ends a window early
        keep = draft_policy(parts, draft).keep_drafting
        gamma = pearl_gamma(parts, parallel=False)
        if keep is not None and parts.config.pearl.gamma is None:  # unsure drafts stop it: the window may be long
            gamma = max(gamma, draft.num_draft_tokens)
        events = {**events, "pearl_parallel_declined": 1} if declined else events
        decoder = PearlDecoder(parts.target, parts.drafter, verifier, parts.config.pearl, gamma, events, keep)
        return with_guard(decoder, parts, True, sampling)  # its halves run one after the other
    if "pearl_parallel" not in parts.started:
        from quickdraft.decoding.pearl_parallel import ParallelPearl, ParallelSpec, split_cores

        cfg = parts.config
        spec = ParallelSpec(
            parts.target_name,
            cfg.drafter_stages,
            cfg.dtype,
            cfg.pearl,
            cfg.verifier,
            split_cores(),
            cfg.runtime,
            cfg.quant,
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
    "siblings",
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
            (
                "drafter",
                "guard",
                "verifier",
                "gamma",
                "draft_schedule",
                "confidence_threshold",
                "pre_verify",
                "post_verify",
                "parallel",
            ),
            cpu_only=True,  # its parallel runner pins CPU cores; CUDA streams are not built
        ),
    )
}
