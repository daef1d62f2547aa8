"""The target's first N layers as its draft (`truncated:N[;vocab=K]`): a copy that shares the target's
embeddings and keeps its own cache, drafting as any model drafter does (`model_drafter.py`)."""

from __future__ import annotations

from pathlib import Path

from quickdraft.drafters.draft_models.model_drafter import ModelDrafter, model_drafter, own_dtype
from quickdraft.drafters.draft_models.vocab import restricted_head, split_vocab
from quickdraft.drafters.kinds import DrafterKind, DrafterSpec
from quickdraft.drafters.spec import int_arg
from quickdraft.errors import QuickdraftError
from quickdraft.weights.loading import LoadedModel, load_model, truncated_copy


def parse_truncated(arg: str | None) -> tuple[int, str | None]:
    """`truncated:N[;vocab=K]` -> (N, K or None): the target's first N layers (its head restricted to K ids)."""
    layers, vocab = split_vocab("truncated", arg)
    return int_arg("truncated", layers), vocab


def _truncated(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> ModelDrafter:
    layers, vocab = spec.value
    draft = truncated_copy(target, layers, own_dtype(dtype, target))
    draft.head_ids = restricted_head(target, vocab)
    return model_drafter(draft, target, str(spec), runtime)


def _save_truncated(spec: DrafterSpec, target: str | None, out: str | None) -> None:
    """`export`: the target's first N layers saved as an ordinary HF folder at `out` (vLLM keeps the whole
    head), for vLLM's draft_model to load."""
    if out is None:
        raise QuickdraftError("a truncated draft must be saved for vLLM: add --draft-out DIR")
    draft = truncated_copy(load_model(target, "bfloat16"), spec.value[0])
    draft.model.save_pretrained(out)
    if draft.tokenizer is not None:
        draft.tokenizer.save_pretrained(out)


def _export_truncated(spec: DrafterSpec, num_draft_tokens: int, draft_dir: str | None) -> dict:
    if draft_dir is None:
        raise QuickdraftError("a truncated draft must be saved for vLLM: add --draft-out DIR")
    return {
        "method": "draft_model",
        "model": str(Path(draft_dir).resolve()),
        "num_speculative_tokens": num_draft_tokens,
    }


KIND = DrafterKind(
    name="truncated",
    usage="truncated:N[;vocab=K]",
    summary="the target's first N layers, its norm and LM head (;vocab=K: the head's K most frequent ids)",
    build=_truncated,
    parse_arg=parse_truncated,
    drafts_trees=True,
    can_review=True,
    hf_model=True,
    export=_export_truncated,
    save_draft=_save_truncated,
)
