"""Drafters and the kind -> builder registry used by every surface (CLI, server, bench, API).

A drafter is named by a spec string (grammar and parser in `drafters/spec.py`): "ngram[:N[:M]]"
(prompt lookup), "model:PATH" (an independent draft model folder), "truncated:N" (the target's first
N layers + norm + head), "distilled[:PATH]" (a DistillSpec delta; without PATH the one shipped for
the embedded default target), "head[:PATH]" and "kangaroo[:PATH]" (drafters that reuse the target:
drafters/reuse.py), "mag[:PATH]" (CS Drafting's statistical drafter) and
"csd[:LEVELS[;k=ROWS][;l=L]]" (a CS Drafting cascade over any of these: drafters/cascade.py),
"quant[:int4|int8|gguf]" (the target's own weights quantized: models/quant.py); "A+B"
is a fallback chain tried in order each round; a model stage may end with "@DTYPE" to run in its own
dtype (e.g. "distilled@bfloat16" under a float32 target: the draft's precision never affects
losslessness).

Adding a drafter kind: its syntax in `spec.SYNTAX`, its builder in `BUILDERS`. Nothing else changes.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from quickdraft.drafters.base import Drafter, empty_proposal
from quickdraft.drafters.cascade import CascadeDrafter
from quickdraft.drafters.fallback import FallbackDrafter
from quickdraft.drafters.mag import MaGDrafter, load_bigram, shipped_bigram
from quickdraft.drafters.model_drafter import ModelDrafter
from quickdraft.drafters.ngram import PromptLookupDrafter, prompt_lookup
from quickdraft.drafters.reuse import REUSING_BUILDERS
from quickdraft.drafters.spec import (
    SYNTAX,
    DrafterSpec,
    int_arg,
    ngram_sizes,
    parse_cascade,
    parse_drafter_spec,
    parse_mix,
    parse_quant,
    parse_suffix,
)
from quickdraft.errors import QuickdraftError
from quickdraft.models.delta import load_delta, shipped_delta_dir
from quickdraft.models.loading import LoadedModel, check_vocab, load_model, resolve_dtype, truncated_copy
from quickdraft.models.runtime import cached_model

# (parsed stage, target, dtype the draft runs in ("" = the target's), runtime) -> drafter
Builder = Callable[[DrafterSpec, LoadedModel, str, str], Drafter]


def ngram_drafter(arg: str | None) -> PromptLookupDrafter:
    """The prompt-lookup drafter for the "N" or "N:M" after "ngram:" (longest, shortest n-gram)."""
    longest, shortest = ngram_sizes(arg)
    return PromptLookupDrafter(max_ngram=longest, min_ngram=shortest)


def _model_drafter(draft: LoadedModel, target: LoadedModel, name: str, runtime: str) -> Drafter:
    vocab = check_vocab(target, draft)
    return ModelDrafter(cached_model(draft.model, vocab, draft.head_ids, runtime), name=name)


def _own_dtype(dtype: str, target: LoadedModel):
    """The torch dtype a copied draft runs in: the one asked for, else the target's."""
    return resolve_dtype(dtype) if dtype else target.model.dtype


def _ngram(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    return ngram_drafter(spec.arg)


def _model(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    return _model_drafter(load_model(spec.arg, dtype), target, str(spec), runtime)


def _truncated(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    layers = int_arg("truncated", spec.arg)
    return _model_drafter(truncated_copy(target, layers, _own_dtype(dtype, target)), target, str(spec), runtime)


def _distilled(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    folder = shipped_delta_dir(target) if spec.arg is None else Path(spec.arg).expanduser()
    draft = load_delta(target, folder, _own_dtype(dtype, target))
    return _model_drafter(draft, target, str(spec), runtime)


def _mag(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    """MaG with the bigram table at PATH, else the one shipped for the target (none: lookup only)."""
    if spec.arg is not None:
        return MaGDrafter(load_bigram(Path(spec.arg).expanduser(), target.vocab_size), name=str(spec))
    shipped = shipped_bigram(target)
    return MaGDrafter(None if shipped is None else load_bigram(shipped, target.vocab_size), name=str(spec))


def _suffix(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    """Suffix trees over the datastore at PATH, else the one shipped for the target (none: the
    request's own text only; `suffix:none` asks for that)."""
    from quickdraft.drafters.datastore import load_datastore, shipped_datastore
    from quickdraft.drafters.suffix import SuffixConfig, SuffixDrafter

    path, options = parse_suffix(spec.arg)
    folder = shipped_datastore(target) if path is None else (None if path == "none" else Path(path).expanduser())
    if path is None and folder is None:
        print(
            f"quickdraft: no suffix datastore ships for {target.name}: drafting from the request's own text "
            "(build one with `quickdraft build-datastore`)",
            file=sys.stderr,
        )
    index = None if folder is None else load_datastore(folder, target.vocab_size)
    return SuffixDrafter(index, SuffixConfig(**options), name=str(spec))


def _mix(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    """The shipped suffix datastore's drafter and the model stage (default the feature head) in one tree."""
    from quickdraft.drafters.mixed import MixedTreeDrafter

    stage = parse_mix(spec.arg)
    suffix = _suffix(DrafterSpec("suffix"), target, "", runtime)
    model = BUILDERS[stage.kind](stage, target, stage.dtype or (dtype if stage.kind == "model" else ""), runtime)
    return MixedTreeDrafter(suffix, model, name=str(spec))


def _quant(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    """The target's own weights quantized (int4 by default), run natively with its own cache; in the
    target's dtype, float32 under a float64 target (the kernels take no float64), or "@DTYPE"."""
    from quickdraft.models.quant import check_dtype
    from quickdraft.models.quantized import quantize_model

    if runtime == "hf":
        raise QuickdraftError(f"drafter {spec}: quantized drafts need the native runtime (not --runtime hf)")
    own = _own_dtype(dtype, target)
    own = torch.float32 if own == torch.float64 and not spec.dtype else own
    check_dtype(own, f"drafter {spec}")
    model = target.model if own == target.model.dtype else copy.deepcopy(target.model).to(own)
    quantized = quantize_model(target, parse_quant(spec.arg), own)
    return ModelDrafter(cached_model(model, target.vocab_size, None, "native", quantized.linears), name=str(spec))


def _csd(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> Drafter:
    cascade = parse_cascade(spec.arg)
    levels = [
        BUILDERS[level.kind](level, target, dtype if level.kind == "model" else "", runtime) for level in cascade.levels
    ]
    return CascadeDrafter(levels, cascade.k, cascade.lenience, name=str(spec))


BUILDERS: dict[str, Builder] = {
    "ngram": _ngram,
    "model": _model,
    "truncated": _truncated,
    "distilled": _distilled,
    **REUSING_BUILDERS,
    "mag": _mag,
    "csd": _csd,
    "suffix": _suffix,
    "mix": _mix,
    "quant": _quant,
}
DRAFTERS = BUILDERS  # the name earlier releases exported
assert set(BUILDERS) == set(SYNTAX), "every drafter kind needs both a syntax and a builder"


def make_drafter(spec: str, target: LoadedModel, dtype: str = "bfloat16", runtime: str = "auto") -> Drafter:
    """Build a drafter from its spec string (see the module docstring).

    `dtype` is the engine's: an independent draft model loads in it, a copied draft (truncated,
    distilled) keeps the target's; "@DTYPE" at the end of a stage overrides both. `runtime` picks
    the forward of model drafters (models/runtime.py).
    """
    stages = parse_drafter_spec(spec)
    drafters = []
    for stage in stages:
        own = stage.dtype or (dtype if stage.kind == "model" else "")
        drafters.append(BUILDERS[stage.kind](stage, target, own, runtime))
    return drafters[0] if len(drafters) == 1 else FallbackDrafter(drafters)


__all__ = [
    "BUILDERS",
    "DRAFTERS",
    "Drafter",
    "DrafterSpec",
    "FallbackDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "empty_proposal",
    "make_drafter",
    "ngram_drafter",
    "parse_drafter_spec",
    "prompt_lookup",
]
