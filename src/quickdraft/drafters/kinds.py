"""One record per drafter kind: everything the surfaces need to know about a kind, in one place.

Each kind's record (`KIND = DrafterKind(...)`) lives in the file that implements it
(`drafters/model_free/ngram.py`, `drafters/from_target/feature_head.py`, ...). `drafters/__init__.py` registers them all
into `KINDS` once, and every surface reads them from there: the spec parser (syntax, argument check,
whether `@DTYPE` applies), the builder registry, the method registry (PEARL refuses kinds that read
the target), `train-draft` (trainable modules), `export` (the vLLM mapping), the bench (which kinds
transformers' assisted generation can run) and the `--drafter` help text.

Adding a drafter kind is one new file with its class and its record, one line in
`drafters/__init__.py`'s registration, and its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from quickdraft.errors import QuickdraftError
from quickdraft.weights.delta import SHIPPED_FOR

ASSETS = Path(__file__).resolve().parent.parent / "assets"


@dataclass(frozen=True)
class DrafterSpec:
    """One parsed stage: kind, its argument as written (None when absent), its own dtype (None:
    inherit) and `value`, the argument as its kind's parser typed it (`DrafterKind.parse_arg`: a path,
    sizes, a QuantSpec, (path, {option: value}), ...), which the kind's builder reads. Made by the
    spec parser (`drafters/spec.py`) or `DrafterSpec.of`; stages compare by their text."""

    kind: str
    arg: str | None = None
    dtype: str | None = None
    value: object = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, kind: str, arg: str | None = None, dtype: str | None = None) -> DrafterSpec:
        """A stage of a registered kind, its argument parsed (and so checked) by the kind's own parser."""
        return cls(kind, arg, dtype, kind_of(kind).parse_arg(arg))

    def __str__(self) -> str:
        text = self.kind + (f":{self.arg}" if self.arg is not None else "")
        return text + (f"@{self.dtype}" if self.dtype else "")


def optional_path(arg: str | None) -> str | None:
    """The argument of a kind whose argument is an optional path (checked when it loads): as written."""
    return arg


# (parsed stage, target LoadedModel, dtype the draft runs in ("" = the target's), runtime) -> Drafter
Builder = Callable[[DrafterSpec, object, str, str], object]
# (parsed stage, draft tokens per round, folder the caller saved a draft to) -> vLLM speculative_config
Exporter = Callable[[DrafterSpec, int, "str | None"], dict]


@dataclass(frozen=True)
class DrafterKind:
    """What one drafter kind is.

    Attributes:
        name: the kind as written in a spec (`ngram`, `head`, ...).
        usage: its syntax, e.g. "ngram[:N[:M]]".
        summary: one line for the `--drafter` help.
        build: its builder (`Builder`).
        parse_arg: the argument's parser (one line a bad argument: QuickdraftError), run once when the
            spec is parsed, before any model loads; what it returns is the stage's `value`.
        has_model: it runs a model (takes "@DTYPE"; its steps cost a forward).
        takes_dtype: an independent draft model (or a kind that hands the dtype to its model stages):
            it runs in the engine's dtype unless "@DTYPE" says otherwise; a copied draft keeps the
            target's.
        reads_target: which of the target's states it reads: "" none, "features" (the final-normed
            rows the LM head reads), "layer l" (the state entering the exit layer l). Such a kind
            needs the native runtime and cannot run under PEARL.
        drafts_trees: it drafts token trees, not only paths.
        can_review: it can review lower levels in a CS Drafting cascade (`review`).
        hf_model: it is a whole causal LM that transformers' assisted generation can run.
        hf_prompt_lookup: transformers' assisted generation has it as its own prompt lookup.
        module: its trainable module class (`models/draft_heads.py`), trained by `train-draft`.
        from_module: (module, lm, eta, name) -> the drafter running a trained module (training's
            decode evaluation).
        decode_length: draft tokens per round in training's decode evaluation.
        trained_by: the command that trains or builds what it loads ("" = nothing to train).
        asset: the folder under `assets/` where its module or table ships for the default target.
        export: its vLLM `speculative_config` mapping (None: no vLLM equivalent).
        save_draft: (stage, target folder or None, out folder or None) -> saves the draft vLLM is to
            load (a copied draft that exists in no folder yet), before `export` maps it.
    """

    name: str
    usage: str
    summary: str
    build: Builder
    parse_arg: Callable[[str | None], object] = optional_path
    has_model: bool = True
    takes_dtype: bool = False
    reads_target: str = ""
    drafts_trees: bool = False
    can_review: bool = False
    hf_model: bool = False
    hf_prompt_lookup: bool = False
    module: type | None = None
    from_module: Callable | None = None
    decode_length: int = 4
    trained_by: str = ""
    asset: str = ""
    export: Exporter | None = None
    save_draft: Callable[[DrafterSpec, str | None, str | None], None] | None = None


KINDS: dict[str, DrafterKind] = {}


def register(*kinds: DrafterKind) -> None:
    """Add kinds to `KINDS` (`drafters/__init__.py` registers every shipped kind once)."""
    for kind in kinds:
        if kind.name in KINDS and KINDS[kind.name] is not kind:
            raise ValueError(f"drafter kind {kind.name!r} registered twice")
        KINDS[kind.name] = kind


def stage_dtype(stage: DrafterSpec, dtype: str) -> str:
    """The dtype a stage's draft runs in: its own "@DTYPE", else the engine's for an independent
    draft model (and for a cascade or a mixed tree, which hand it to their model stages), else "" (a
    copied draft keeps the target's)."""
    return stage.dtype or (dtype if kind_of(stage.kind).takes_dtype else "")


def kind_of(name: str) -> DrafterKind:
    """The record of kind `name`, or a clear error listing the kinds."""
    if name not in KINDS:
        raise QuickdraftError(f"unknown drafter {name!r}; choose one of: {usages()}, or a '+' chain of them")
    return KINDS[name]


def usages() -> str:
    return ", ".join(k.usage for k in KINDS.values())


def help_text() -> str:
    """The `--drafter` help: every kind's syntax and summary."""
    return "; ".join(f"{k.usage}: {k.summary}" for k in KINDS.values()) + "; A+B: a fallback chain tried in order"


def shipped_asset(asset: str, target_name: str | None) -> Path | None:
    """`assets/ASSET/KEY` for a target that ships assets (the embedded default), else None."""
    key = SHIPPED_FOR.get(target_name or "")
    return None if key is None else ASSETS / asset / key
