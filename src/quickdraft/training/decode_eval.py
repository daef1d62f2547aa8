"""Decoding with a module being trained: greedy speculative decoding on held-out prompts, for
training's evaluations (tokens per target forward, acceptance by position) and for a head's gain
table (tokens per forward by tree budget: what sizes its `draft_tree` auto on each host)."""

from __future__ import annotations

import copy
import gc

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.drafters.from_target.reuse import HeadLM
from quickdraft.drafters.kinds import KINDS
from quickdraft.host import release_free_memory
from quickdraft.models.draft_heads import for_inference


def decode_eval(
    module,
    kind: str,
    target,
    head_ids,
    prompts: list[list[int]],
    max_new_tokens: int = 48,
    tree: int = 0,
    width: int = DraftConfig.tree_width,
    quantize: str = "none",
) -> dict:
    """Greedy speculative decoding with a copy of `module` (in the target's dtype) on held-out
    prompts: tokens per target forward (the bonus token included) and draft acceptance; chains of
    the kind's `decode_length`, or dynamic trees of `tree` nodes and `width` (the head). `quantize`:
    the target's weights as the run reads them (`--quantize`; a caller holding that Quantized shares
    it with this engine, `quantize_model`)."""
    from quickdraft.engine import Engine  # the engine sits above the distill package's modules
    from quickdraft.settings.options import options_from

    draft = for_inference(copy.deepcopy(module).to(target.model.dtype))  # the copy drafts as a shipped module
    lm = HeadLM(
        target.model.get_input_embeddings().weight.detach(),
        target.model.get_output_embeddings().weight.detach(),
        target.vocab_size,
        head_ids,
    )
    record = KINDS[kind]
    drafter = record.from_module(draft, lm, 0.6, kind)
    config = options_from(
        {
            "method": "sd",
            "drafter": kind,
            "draft_length": record.decode_length,
            "draft_tree": tree,
            "tree_width": width,
            "quantize": quantize,
        }
    )
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
    del engine, drafter  # each engine packs its own copy of the target's linears (3 GB for the Qwen 1.5B in
    gc.collect()  # bf16): freed before the next of a gain table's 15 (they piled up to an OOM kill at 24 GB)
    release_free_memory()
    return {
        "tokens_per_target_forward": tokens / max(1, forwards),
        "draft_acceptance": accepted / max(1, drafted),
        "acceptance_by_position": [round(a / d, 4) if d else None for a, d in zip(acc, dra, strict=True)],
        "draft_length": record.decode_length,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
    }


# {tree budget: the widths measured at it}; width 1 is a chain (not past 8 nodes), width = budget a
# star of first tokens (wider is the same tree); narrow trees stop at 16 nodes
GAIN_SHAPES = {1: (1,), 2: (1, 2), 4: (1, 2, 4), 8: (1, 2, 4, 8), 16: (2, 4, 8), 32: (4, 8)}
GAIN_BUDGETS = tuple(GAIN_SHAPES)
GAIN_TOKENS = 48  # new tokens per prompt


def tree_gain(
    module, target, head_ids, prompts: list[list[int]], max_new_tokens: int = GAIN_TOKENS, quantize: str = "none"
) -> tuple[dict[int, float], dict[int, int]]:
    """A trained head's gain table: ({tree budget: tokens per target forward}, {budget: the width
    that gave it}), greedy on held-out `prompts`, the best of the dynamic trees of GAIN_SHAPES'
    widths at each budget (narrow ones win at small budgets: a wide tree of 4 is a star of first
    tokens). It sizes the head's `draft_tree` auto on each host (decoding/registry.py)."""
    gain: dict[int, float] = {}
    widths: dict[int, int] = {}
    for b, shapes in GAIN_SHAPES.items():
        for w in shapes:
            tpf = decode_eval(module, "head", target, head_ids, prompts, max_new_tokens, b, w, quantize)
            value = round(tpf["tokens_per_target_forward"], 3)
            if value > gain.get(b, 0.0):
                gain[b], widths[b] = value, w
    return gain, widths


def gain_meta(
    gain: tuple[dict[int, float], dict[int, int]], prompts: int, max_new_tokens: int = GAIN_TOKENS, command: str = ""
) -> dict:
    """What a head's json keeps of its gain table: the table, its widths and how it was measured."""
    how = {
        "prompts": prompts,
        "max_new_tokens": max_new_tokens,
        "widths_tried": sorted({w for ws in GAIN_SHAPES.values() for w in ws}),
        "greedy": True,
    }
    how.update({"command": command} if command else {})
    return {
        "tree_gain": {str(b): v for b, v in gain[0].items()},
        "tree_gain_width": {str(b): w for b, w in gain[1].items()},
        "tree_gain_measured": how,
    }
