"""Drafters and the name -> builder registry used at the CLI/server/benchmark edge.

Specs: "ngram" (prompt lookup; "ngram:N" sets the longest n-gram, "ngram:N:M" also the shortest,
default 1), "model:PATH" (an independent draft model folder), "truncated:N" (the target's first N
layers + norm + head, a real-weights stand-in for a draft model), "distilled" (the DistillSpec draft
shipped for the embedded default target) or "distilled:PATH" (a distilled delta folder written by `quickdraft distill`).
Specs joined by "+" form a fallback chain, tried in order each round (e.g. "ngram:3:2+distilled": the
n-gram copy where a suffix of 2 or 3 tokens recurs, the distilled draft elsewhere).

A model drafter's spec may end with "@DTYPE" to run the draft in another dtype than the target, e.g.
"distilled@bfloat16" under a float32 target (the draft's precision never affects losslessness).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from quickdraft.drafters.base import Drafter, empty_proposal
from quickdraft.drafters.fallback import FallbackDrafter
from quickdraft.drafters.model_drafter import ModelDrafter
from quickdraft.drafters.ngram import PromptLookupDrafter, prompt_lookup
from quickdraft.errors import QuickdraftError
from quickdraft.models.cached_model import CachedModel
from quickdraft.models.loading import DTYPES, LoadedModel, check_vocab, load_model, resolve_dtype, truncated_copy

Builder = Callable[[str | None, LoadedModel, str], Drafter]


def _int_arg(kind: str, arg: str | None, default: int | None) -> int:
    if arg is None and default is not None:
        return default
    try:
        return int(arg)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise QuickdraftError(f"drafter {kind!r} needs an integer argument, e.g. {kind}:3 (got {arg!r})") from None


def ngram_drafter(arg: str | None) -> PromptLookupDrafter:
    """The prompt-lookup drafter for the "N" or "N:M" after "ngram:" (longest, shortest n-gram)."""
    longest, _, shortest = (arg or "").partition(":")
    return PromptLookupDrafter(
        max_ngram=_int_arg("ngram", longest or None, 3), min_ngram=_int_arg("ngram", shortest or None, 1)
    )


def _ngram(arg: str | None, target: LoadedModel, dtype: str) -> Drafter:
    return ngram_drafter(arg)


def _model_drafter(draft: LoadedModel, target: LoadedModel, name: str) -> Drafter:
    vocab = check_vocab(target, draft)
    return ModelDrafter(CachedModel(draft.model, vocab, draft.head_ids), name=name)


def _model(arg: str | None, target: LoadedModel, dtype: str) -> Drafter:
    if not arg:
        raise QuickdraftError("drafter 'model' needs a path: model:PATH")
    return _model_drafter(load_model(arg, dtype), target, f"model:{arg}")


def _own_dtype(dtype: str, target: LoadedModel):
    """The torch dtype a copied draft runs in: the one asked for, else the target's."""
    return resolve_dtype(dtype) if dtype else target.model.dtype


def _truncated(arg: str | None, target: LoadedModel, dtype: str) -> Drafter:
    layers = _int_arg("truncated", arg, None)
    return _model_drafter(truncated_copy(target, layers, _own_dtype(dtype, target)), target, f"truncated:{layers}")


def _distilled(arg: str | None, target: LoadedModel, dtype: str) -> Drafter:
    from quickdraft.distill.student import load_delta, shipped_delta_dir

    folder = shipped_delta_dir(target) if arg is None else Path(arg).expanduser()
    draft = load_delta(target, folder, _own_dtype(dtype, target))
    return _model_drafter(draft, target, f"distilled:{arg}" if arg else "distilled")


DRAFTERS: dict[str, Builder] = {
    "ngram": _ngram,
    "model": _model,
    "truncated": _truncated,
    "distilled": _distilled,
}


def split_dtype(spec: str) -> tuple[str, str | None]:
    """ "distilled@bfloat16" -> ("distilled", "bfloat16"); a spec without a dtype suffix -> (spec, None)."""
    head, sep, tail = spec.rpartition("@")
    if not sep:
        return spec, None
    if tail not in DTYPES:
        raise QuickdraftError(f"drafter {spec!r}: unknown dtype {tail!r} after '@'; choose one of {', '.join(DTYPES)}")
    return head, tail


def make_drafter(spec: str, target: LoadedModel, dtype: str = "bfloat16") -> Drafter:
    """Build a drafter from its spec string (see the module docstring).

    `dtype` is the engine's: an independent draft model loads in it, a copied draft (truncated,
    distilled) keeps the target's; "@DTYPE" at the end of the spec overrides both.
    """
    if "+" in spec:
        stages = spec.split("+")
        if not all(stages):
            raise QuickdraftError(f"drafter {spec!r}: empty stage in a '+' chain")
        return FallbackDrafter([make_drafter(stage, target, dtype) for stage in stages])
    spec, own = split_dtype(spec)
    kind, _, arg = spec.partition(":")
    if kind not in DRAFTERS:
        raise QuickdraftError(
            f"unknown drafter {spec!r}; choose one of: ngram[:N[:M]], model:PATH, truncated:N, distilled[:PATH],"
            " or a '+' chain of them"
        )
    if own is not None and kind == "ngram":
        raise QuickdraftError("the ngram drafter has no dtype: drop the '@...' suffix")
    if own is not None:
        return DRAFTERS[kind](arg or None, target, own)
    return DRAFTERS[kind](arg or None, target, dtype if kind == "model" else "")


__all__ = [
    "Drafter",
    "DRAFTERS",
    "FallbackDrafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "empty_proposal",
    "make_drafter",
    "ngram_drafter",
    "prompt_lookup",
]
