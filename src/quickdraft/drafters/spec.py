"""The drafter-spec grammar and its one parser (no models are loaded here).

    chain   := stage ("+" stage)*            a fallback chain, tried in order each round
    stage   := kind [":" arg] ["@" DTYPE]     DTYPE: bfloat16 | float32 | float64 (model drafters only)

The kinds, their syntax and their argument checks are the records in `drafters/kinds.py` (each
declared in the file that implements it, with its argument parser: `ngram_sizes` in ngram.py,
`parse_suffix` in suffix.py, `parse_mix` in mixed.py, `parse_cascade` in cascade.py, `parse_quant`
in model_drafter.py); `quickdraft generate --help` lists them. Every surface (CLI, server, bench,
export, Python API) parses through `parse_drafter_spec`, so a bad spec is refused with the same
message before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable

from quickdraft.config import DTYPES
from quickdraft.drafters.kinds import KINDS, DrafterSpec, usages
from quickdraft.errors import QuickdraftError


def int_arg(kind: str, arg: str | None, default: int | None = None, lo: int = 1) -> int:
    """An integer drafter argument (>= lo), or `default` when absent."""
    if arg is None and default is not None:
        return default
    try:
        value = int(arg)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise QuickdraftError(f"drafter {kind!r} needs an integer argument, e.g. {kind}:3 (got {arg!r})") from None
    if value < lo:
        raise QuickdraftError(f"drafter {kind!r}: the argument must be >= {lo}, got {value}")
    return value


def required_path(kind: str) -> Callable[[str | None], str]:
    """The argument parser of a kind that needs a path: the path as written."""

    def check(arg: str | None) -> str:
        if not arg:
            raise QuickdraftError(f"drafter {kind!r} needs a path: {kind}:PATH")
        return arg

    return check


def parse_stage(text: str, whole: str) -> DrafterSpec:
    """One stage `kind[:arg][@DTYPE]` of the spec `whole` (named in errors), its argument checked by
    its kind's own parser (`DrafterKind.parse_arg`, declared beside the kind): the stage's `value`."""
    body, at, dtype = text.rpartition("@") if "@" in text else (text, "", "")
    if at and dtype not in DTYPES:
        raise QuickdraftError(
            f"drafter {whole!r}: unknown dtype {dtype!r} after '@'; choose one of {', '.join(DTYPES)}"
        )
    kind, colon, arg = body.partition(":")
    if kind not in KINDS:
        raise QuickdraftError(f"unknown drafter {text!r}; choose one of: {usages()}, or a '+' chain of them")
    syntax = KINDS[kind]
    if at and not syntax.has_model:
        raise QuickdraftError(f"the {kind} drafter has no dtype: drop the '@...' suffix")
    arg_or_none = arg if colon and arg else None
    return DrafterSpec(kind, arg_or_none, dtype or None, syntax.parse_arg(arg_or_none))


def parse_drafter_spec(text: str) -> tuple[DrafterSpec, ...]:
    """Parse a drafter spec string into its stages (one, or several for a '+' chain)."""
    if not isinstance(text, str) or not text.strip():
        raise QuickdraftError("the drafter spec is empty")
    stages = text.strip().split("+")
    if not all(stages):
        raise QuickdraftError(f"drafter {text!r}: empty stage in a '+' chain")
    return tuple(parse_stage(stage, text) for stage in stages)
