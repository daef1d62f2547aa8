"""The drafter-spec grammar and its one parser (no models are loaded here).

    chain   := stage ("+" stage)*            a fallback chain, tried in order each round
    stage   := kind [":" arg] ["@" DTYPE]     DTYPE: bfloat16 | float32 | float64 (model drafters only)

Kinds (the registry in `drafters/__init__.py` builds them): `ngram[:N[:M]]` (prompt lookup, longest
N and shortest M n-gram, default 3 and 1), `model:PATH` (an independent draft model folder),
`truncated:N` (the target's first N layers), `distilled[:PATH]` (a DistillSpec delta; without PATH
the one shipped for the default target), `head[:PATH]` (an EAGLE-style feature head on the target's
last hidden states) and `kangaroo[:PATH]` (the target's first l layers + a Kangaroo adapter); the
last two are trained by `quickdraft train-draft`, ship for the default target and need the native
runtime; `mag[:PATH]` (CS Drafting's MaG: prompt lookup, then a bigram table of the target's text)
and `csd[:LEVELS[;k=ROWS][;l=L]]` (a CS Drafting cascade: `parse_cascade`); `specdec[:PATH]`
(SpecDec's non-autoregressive block drafter, trained by `train-draft --kind specdec`);
`suffix[:PATH][;cache=N]...` (model-free suffix-match trees over the request's text and a datastore
of the target's own text: `parse_suffix`); `mix[:STAGE]` (suffix branches and a model drafter's in
one tree, default the feature head: `drafters/mixed.py`); `quant[:int4[:G]|int8|gguf]` (the target's
own weights quantized, a self-draft with its own cache: models/quant.py). Every surface (CLI,
server, bench, export, Python API) parses through `parse_drafter_spec`, so a bad spec is refused
with the same message before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quickdraft.config import DTYPES
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


def _required_path(kind: str) -> Callable[[str | None], None]:
    def check(arg: str | None) -> None:
        if not arg:
            raise QuickdraftError(f"drafter {kind!r} needs a path: {kind}:PATH")

    return check


@dataclass(frozen=True)
class KindSyntax:
    """How one drafter kind is written: its argument check and whether it runs a model (takes @DTYPE)."""

    usage: str
    check_arg: Callable[[str | None], object]
    has_model: bool = True


SYNTAX: dict[str, KindSyntax] = {
    "ngram": KindSyntax("ngram[:N[:M]]", ngram_sizes, has_model=False),
    "model": KindSyntax("model:PATH", _required_path("model")),
    "truncated": KindSyntax("truncated:N", lambda arg: int_arg("truncated", arg)),
    "distilled": KindSyntax("distilled[:PATH]", lambda arg: None),
    "head": KindSyntax("head[:PATH]", lambda arg: None),
    "kangaroo": KindSyntax("kangaroo[:PATH]", lambda arg: None),
    "specdec": KindSyntax("specdec[:PATH]", lambda arg: None),
    "mag": KindSyntax("mag[:PATH]", lambda arg: None, has_model=False),
    "csd": KindSyntax("csd[:LEVELS[;k=ROWS][;l=L]]", lambda arg: parse_cascade(arg), has_model=False),
    "mix": KindSyntax("mix[:STAGE]", lambda arg: parse_mix(arg), has_model=False),
    "suffix": KindSyntax("suffix[:PATH][;cache=N][;match=M][;depth=D]", lambda arg: parse_suffix(arg), has_model=False),
    "quant": KindSyntax("quant[:int4[:G]|int8|gguf]", lambda arg: parse_quant(arg)),
}


def parse_quant(arg: str | None):
    """`quant[:MODE]`: the target's own weights quantized (MODE as `--quantize`, default int4)."""
    from quickdraft.models.quant import parse_quantize

    spec = parse_quantize(arg or "int4")
    if not spec.active:
        raise QuickdraftError("drafter 'quant:none' would be the target itself: choose int4, int8 or gguf")
    return spec


def parse_mix(arg: str | None) -> DrafterSpec:
    """`mix[:STAGE]`: suffix branches plus the tree-drafting STAGE's (default `head`, the feature head)."""
    stage = _parse_stage(arg or "head", f"mix:{arg or 'head'}")
    if stage.kind in ("mix", "suffix", "csd", "ngram", "mag"):
        raise QuickdraftError(f"drafter 'mix:{arg}': the second source must be a model drafter (head, distilled, ...)")
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


@dataclass(frozen=True)
class DrafterSpec:
    """One parsed stage: kind, its argument (None when absent) and its own dtype (None: inherit)."""

    kind: str
    arg: str | None = None
    dtype: str | None = None

    def __str__(self) -> str:
        text = self.kind + (f":{self.arg}" if self.arg is not None else "")
        return text + (f"@{self.dtype}" if self.dtype else "")


def _parse_stage(text: str, whole: str) -> DrafterSpec:
    body, at, dtype = text.rpartition("@") if "@" in text else (text, "", "")
    if at and dtype not in DTYPES:
        raise QuickdraftError(
            f"drafter {whole!r}: unknown dtype {dtype!r} after '@'; choose one of {', '.join(DTYPES)}"
        )
    kind, colon, arg = body.partition(":")
    if kind not in SYNTAX:
        usage = ", ".join(s.usage for s in SYNTAX.values())
        raise QuickdraftError(f"unknown drafter {text!r}; choose one of: {usage}, or a '+' chain of them")
    syntax = SYNTAX[kind]
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
