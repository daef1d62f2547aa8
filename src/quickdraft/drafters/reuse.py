"""Builders of the drafters that reuse the target: `head[:PATH]` (feature head), `kangaroo[:PATH]`
(Kangaroo adapter) and `specdec[:PATH]` (SpecDec's block drafter). Without PATH, the module shipped
for the embedded default target (`assets/KIND/...`, trained by `quickdraft train-draft`)."""

from __future__ import annotations

from pathlib import Path

from quickdraft.drafters.block import BlockDrafterRunner
from quickdraft.drafters.feature_head import FeatureHeadDrafter, HeadLM
from quickdraft.drafters.kangaroo import KangarooDrafter
from quickdraft.drafters.spec import DrafterSpec
from quickdraft.errors import QuickdraftError
from quickdraft.models.delta import SHIPPED_FOR
from quickdraft.models.draft_heads import HEAD_META, SHIPPED_HEADS, load_draft_head
from quickdraft.models.loading import LoadedModel, resolve_dtype
from quickdraft.models.native import unsupported_reason


def shipped_head_dir(kind: str, target: LoadedModel) -> Path:
    """The folder of the `kind` module shipped for `target` (only the embedded default has them)."""
    key = SHIPPED_FOR.get(target.name)
    folder = SHIPPED_HEADS / kind / (key or "")
    if key is None or not (folder / HEAD_META).is_file():
        raise QuickdraftError(
            f"no {kind} drafter ships for target {target.name!r}; train one with "
            f"`quickdraft train-draft --kind {kind}` and pass --drafter {kind}:RUN/{kind}"
        )
    return folder


def _check_runtime(kind: str, target: LoadedModel, runtime: str) -> None:
    if runtime == "hf":
        raise QuickdraftError(f"the {kind} drafter reads the target's hidden states: use --runtime native or auto")
    reason = unsupported_reason(target.model)
    if reason is not None:
        raise QuickdraftError(
            f"the {kind} drafter needs the native runtime, which does not support this target: {reason}"
        )


def build_reusing(kind: str, spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str):
    """A FeatureHeadDrafter or KangarooDrafter for `target` from a trained module's folder."""
    _check_runtime(kind, target, runtime)
    folder = shipped_head_dir(kind, target) if spec.arg is None else Path(spec.arg).expanduser()
    own = resolve_dtype(dtype) if dtype else target.model.dtype
    module, head_ids, meta = load_draft_head(folder, kind, target.model, own)
    embed = target.model.get_input_embeddings().weight.detach()
    head = target.model.get_output_embeddings().weight.detach()
    if own != target.model.dtype:
        embed, head = embed.to(own), head.to(own)
    lm = HeadLM(embed, head, target.vocab_size, head_ids)
    return reusing_drafter(kind, module.to(embed.device), lm, eta=float(meta.get("eta", 0.6)), name=str(spec))


def reusing_drafter(kind: str, module, lm: HeadLM, eta: float = 0.6, name: str | None = None):
    """The drafter that runs a `kind` module (head, specdec, kangaroo) through the target's LM head."""
    if kind == "head":
        return FeatureHeadDrafter(module, lm, name=name or kind)
    if kind == "specdec":
        return BlockDrafterRunner(module, lm, name=name or kind)
    return KangarooDrafter(module, lm, eta=eta, name=name or kind)


def _head(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str):
    return build_reusing("head", spec, target, dtype, runtime)


def _kangaroo(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str):
    return build_reusing("kangaroo", spec, target, dtype, runtime)


def _specdec(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str):
    return build_reusing("specdec", spec, target, dtype, runtime)


REUSING_BUILDERS = {"head": _head, "kangaroo": _kangaroo, "specdec": _specdec}
__all__ = ["REUSING_BUILDERS", "build_reusing", "reusing_drafter", "shipped_head_dir"]
