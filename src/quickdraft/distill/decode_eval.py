"""Decoding with a module being trained: greedy speculative decoding on held-out prompts, for
training's evaluations (tokens per target forward, acceptance by position) and for a head's gain
table (tokens per forward by tree budget: what sizes its `draft_tree` auto on each host)."""

from __future__ import annotations

import copy

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.drafters.kinds import KINDS
from quickdraft.drafters.reuse import HeadLM


def decode_eval(
    module, kind: str, target, head_ids, prompts: list[list[int]], max_new_tokens: int = 48, tree: int = 0
) -> dict:
    """Greedy speculative decoding with a copy of `module` (in the target's dtype) on held-out
    prompts: tokens per target forward (the bonus token included) and draft acceptance; chains of
    the kind's `decode_length`, or trees of `tree` nodes (the head)."""
    from quickdraft.engine import Engine  # the engine sits above the distill package's modules
    from quickdraft.options import options_from

    draft = copy.deepcopy(module).to(target.model.dtype).eval().requires_grad_(False)
    lm = HeadLM(
        target.model.get_input_embeddings().weight.detach(),
        target.model.get_output_embeddings().weight.detach(),
        target.vocab_size,
        head_ids,
    )
    record = KINDS[kind]
    drafter = record.from_module(draft, lm, 0.6, kind)
    config = options_from({"method": "sd", "drafter": kind, "draft_length": record.decode_length, "draft_tree": tree})
    engine = Engine(target, config, drafter=drafter)
    tokens = forwards = drafted = accepted = 0
    acc, dra = [0] * record.decode_length, [0] * record.decode_length  # accepted, drafted by position (depth)
    for ids in prompts:
        stats = engine.generate_ids(ids, SamplingConfig(temperature=0.0), StopConfig(max_new_tokens)).stats
        tokens += stats.num_new_tokens
        forwards += stats.num_target_forwards
        drafted += stats.num_draft_tokens
        accepted += stats.num_accepted_draft_tokens
        for i, (a, d) in enumerate(zip(stats.accepted_per_position, stats.drafted_per_position, strict=True)):
            if i >= len(acc):  # a tree deeper than the chain
                acc, dra = acc + [0], dra + [0]
            acc[i], dra[i] = acc[i] + a, dra[i] + d
    return {
        "tokens_per_target_forward": tokens / max(1, forwards),
        "draft_acceptance": accepted / max(1, drafted),
        "acceptance_by_position": [round(a / d, 4) if d else None for a, d in zip(acc, dra, strict=True)],
        "draft_length": record.decode_length,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
    }


GAIN_BUDGETS = (1, 2, 4, 8, 16, 32)
GAIN_TOKENS = 48  # new tokens per prompt


def tree_gain(
    module, target, head_ids, prompts: list[list[int]], max_new_tokens: int = GAIN_TOKENS
) -> dict[int, float]:
    """{tree budget: tokens per target forward} of a trained head, greedy on held-out `prompts`
    (dynamic trees of the default width): the gain table that sizes its `draft_tree` auto on each
    host (decoding/registry.auto_tree_budget)."""
    return {
        b: round(
            decode_eval(module, "head", target, head_ids, prompts, max_new_tokens, tree=b)["tokens_per_target_forward"],
            3,
        )
        for b in GAIN_BUDGETS
    }


def gain_meta(gain: dict[int, float], prompts: int, max_new_tokens: int = GAIN_TOKENS) -> dict:
    """What a head's json keeps of its gain table: the table and how it was measured."""
    how = {"prompts": prompts, "max_new_tokens": max_new_tokens, "tree_width": DraftConfig.tree_width, "greedy": True}
    return {"tree_gain": {str(b): v for b, v in gain.items()}, "tree_gain_measured": how}
