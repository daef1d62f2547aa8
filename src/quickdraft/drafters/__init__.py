"""Drafters, and the registry of drafter kinds every surface reads (CLI, server, bench, export, API).

A drafter is named by a spec string (grammar and parser in `drafters/spec.py`): one stage, or an
"A+B" fallback chain tried in order each round; a model stage may end with "@DTYPE" to run in its
own dtype (e.g. "distilled@bfloat16" under a float32 target: the draft's precision never affects
losslessness). Each kind's record (`drafters/kinds.py`: syntax, builder, what it reads of the
target, whether it drafts trees or reviews, its trainable module, shipped asset and vLLM mapping)
lives in the file that implements it and is registered here, once.

Adding a drafter kind: its file (class and `KIND` record) and one entry in `register(...)` below.
"""

from __future__ import annotations

from quickdraft.drafters.base import Drafter, DraftRequest, draft_path
from quickdraft.drafters.combined import cascade, mixed
from quickdraft.drafters.draft_models import block, distilled, model_drafter
from quickdraft.drafters.draft_models.model_drafter import ModelDrafter
from quickdraft.drafters.fallback import FallbackDrafter
from quickdraft.drafters.from_target import feature_head, kangaroo, truncated
from quickdraft.drafters.kinds import KINDS, DrafterKind, DrafterSpec, register, stage_dtype
from quickdraft.drafters.model_free import mag, ngram, suffix
from quickdraft.drafters.model_free.ngram import PromptLookupDrafter, ngram_drafter, prompt_lookup
from quickdraft.drafters.spec import parse_drafter_spec
from quickdraft.weights.loading import LoadedModel

register(
    ngram.KIND,
    model_drafter.MODEL,
    truncated.KIND,
    distilled.KIND,
    feature_head.KIND,
    kangaroo.KIND,
    block.KIND,
    mag.KIND,
    cascade.KIND,
    suffix.KIND,
    mixed.KIND,
    model_drafter.QUANT,
)
BUILDERS = {name: kind.build for name, kind in KINDS.items()}  # kind -> builder (earlier releases' name)
DRAFTERS = BUILDERS


def make_drafter(
    spec: str | tuple[DrafterSpec, ...], target: LoadedModel, dtype: str = "bfloat16", runtime: str = "auto"
) -> Drafter:
    """Build a drafter from its spec string or its parsed stages (see the module docstring).

    `dtype` is the engine's: an independent draft model loads in it, a copied draft (truncated,
    distilled) keeps the target's; "@DTYPE" at the end of a stage overrides both. `runtime` picks
    the forward of model drafters (runtime/choose.py).
    """
    stages = parse_drafter_spec(spec) if isinstance(spec, str) else spec
    drafters = [KINDS[stage.kind].build(stage, target, stage_dtype(stage, dtype), runtime) for stage in stages]
    return drafters[0] if len(drafters) == 1 else FallbackDrafter(drafters)


__all__ = [
    "BUILDERS",
    "DRAFTERS",
    "KINDS",
    "Drafter",
    "DrafterKind",
    "DrafterSpec",
    "FallbackDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "DraftRequest",
    "draft_path",
    "make_drafter",
    "ngram_drafter",
    "parse_drafter_spec",
    "prompt_lookup",
]
