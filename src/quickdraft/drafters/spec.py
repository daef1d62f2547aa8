"""The drafter-spec grammar and its one parser (no models are loaded here).

    chain   := stage ("+" stage)*            a fallback chain, tried in order each round
    stage   := kind [":" arg] ["@" DTYPE]     DTYPE: bfloat16 | float32 | float64 (model drafters only)

The kinds, their syntax and their argument checks are the records in `drafters/kinds.py` (each
declared in the file that implements it); `quickdraft generate --help` lists them. The argument
grammars of the kinds with structured arguments (cascades, suffix options, mixed trees, quantized
self-drafts) are parsed here. Every surface (CLI, server, bench, export, Python API) parses through
`parse_drafter_spec`, so a bad spec is refused with the same message before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


def ngram_sizes(arg: str | None) -> tuple[int, int]:
    """(longest, shortest) n-gram of "N" or "N:M" (default 3 and 1)."""
    longest, _, shortest = (arg or "").partition(":")
    hi, lo = int_arg("ngram", longest or None, 3), int_arg("ngram", shortest or None, 1)
    if lo > hi:
        raise QuickdraftError(f"drafter 'ngram:{arg}': the shortest n-gram ({lo}) exceeds the longest ({hi})")
    return hi, lo


def required_path(kind: str) -> Callable[[str | None], None]:
    """The argument check of a kind that needs a path."""

    def check(arg: str | None) -> None:
        if not arg:
            raise QuickdraftError(f"drafter {kind!r} needs a path: {kind}:PATH")

    return check


def parse_quant(arg: str | None):
    """`quant[:MODE]`: the target's own weights quantized (MODE as `--quantize`, default int4)."""
    from quickdraft.weights.quant import parse_quantize

    spec = parse_quantize(arg or "int4")
    if not spec.active:
        raise QuickdraftError("drafter 'quant:none' would be the target itself: choose int4, int8 or gguf")
    return spec


def parse_mix(arg: str | None) -> DrafterSpec:
    """`mix[:STAGE]`: suffix branches plus the tree-drafting STAGE's (default `head`, the feature head)."""
    stage = _parse_stage(arg or "head", f"mix:{arg or 'head'}")
    if not (KINDS[stage.kind].has_model and KINDS[stage.kind].drafts_trees):
        able = ", ".join(k.name for k in KINDS.values() if k.has_model and k.drafts_trees)
        raise QuickdraftError(
            f"drafter 'mix:{arg}': the second source must be a model drafter that drafts trees ({able})"
        )
    return stage


def parse_suffix(arg: str | None) -> tuple[str | None, dict[str, int]]:
    """`[PATH][;cache=N][;match=M][;depth=D]` -> (PATH or None, options): PATH a datastore folder
    (absent: the one shipped for the target; `none`: no datastore), cache the tokens of earlier
    requests' outputs kept (0 = off), match the longest suffix searched, depth the longest branch."""
    path, *options = (arg or "").split(";")
    values: dict[str, int] = {}
    names = {"cache": "cache", "match": "max_match", "depth": "depth", "rows": "max_rows"}
    for option in options:
        key, _, value = option.partition("=")
        if key not in names or not value.isdigit():
            raise QuickdraftError(f"drafter 'suffix:{arg}': bad option {option!r} (cache=N, match=M, depth=D, rows=R)")
        values[names[key]] = int(value)
    if any(v < 1 for k, v in values.items() if k != "cache"):
        raise QuickdraftError(f"drafter 'suffix:{arg}': match, depth and rows must be >= 1")
    return path or None, values


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
    parts = text.split(";")
    levels = tuple(_parse_stage(stage, f"csd:{text}") for stage in parts[0].split(">") if stage)
    if len(levels) < 2 or any(level.kind == "csd" for level in levels):
        raise QuickdraftError(
            f"drafter 'csd:{text}': a cascade needs at least two levels (no nested csd), e.g. csd:distilled>mag"
        )
    k, lenience = default_k(len(levels)), 1.0
    for option in parts[1:]:
        key, _, value = option.partition("=")
        try:
            if key == "k":
                k = [[int(x) for x in row.split(",")] for row in value.split("/")]
            elif key == "l":
                lenience = float(value)
            else:
                raise ValueError
        except ValueError:
            raise QuickdraftError(f"drafter 'csd:{text}': bad option {option!r} (k=2,4/4 or l=2)") from None
    if lenience < 1:
        raise QuickdraftError(f"drafter 'csd:{text}': lenience must be >= 1")
    for i, row in enumerate(k):
        if len(row) != len(levels) - i or min(row) < 0 or sum(row) < 1:
            raise QuickdraftError(f"drafter 'csd:{text}': k-matrix row {i} needs {len(levels) - i} quotas >= 0")
    if len(k) not in (len(levels) - 1, len(levels)):
        raise QuickdraftError(f"drafter 'csd:{text}': the k-matrix needs {len(levels) - 1} or {len(levels)} rows")
    return CascadeSpec(levels, tuple(tuple(r) for r in k), lenience)


def _parse_stage(text: str, whole: str) -> DrafterSpec:
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
    syntax.check_arg(arg_or_none)
    return DrafterSpec(kind, arg_or_none, dtype or None)


def parse_drafter_spec(text: str) -> tuple[DrafterSpec, ...]:
    """Parse a drafter spec string into its stages (one, or several for a '+' chain)."""
    if not isinstance(text, str) or not text.strip():
        raise QuickdraftError("the drafter spec is empty")
    stages = text.strip().split("+")
    if not all(stages):
        raise QuickdraftError(f"drafter {text!r}: empty stage in a '+' chain")
    return tuple(_parse_stage(stage, text) for stage in stages)


def with_suffix_cache(text: str, tokens: int) -> str:
    """`text` with `cache=tokens` added to its suffix stages that set no cache (the server's default:
    drafting from earlier requests' outputs too)."""
    stages = []
    for stage in parse_drafter_spec(text):
        if stage.kind == "suffix" and "cache" not in parse_suffix(stage.arg)[1]:
            stage = DrafterSpec("suffix", f"{stage.arg or ''};cache={tokens}", stage.dtype)
        stages.append(str(stage))
    return "+".join(stages)
