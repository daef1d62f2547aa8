"""What the drafters that reuse the target share: the target's LM head as they read it (`HeadLM`) and
the builder of `head[:PATH]` (feature head), `kangaroo[:PATH]` (Kangaroo adapter) and
`specdec[:PATH]` (SpecDec's block drafter) from a trained module's folder. Without PATH, the module
shipped for the embedded default target (`assets/KIND/...`, trained by `quickdraft train-draft`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from quickdraft.drafters.kinds import DrafterSpec, kind_of, shipped_asset
from quickdraft.errors import QuickdraftError
from quickdraft.models.draft_heads import for_inference
from quickdraft.models.head_files import HEAD_META, load_draft_head
from quickdraft.runtime.caches.cached_model import check_head_ids, scatter_head
from quickdraft.runtime.choose import forces_reference
from quickdraft.runtime.forward.native import unsupported_reason
from quickdraft.runtime.kernels.linear import Linear, packs
from quickdraft.weights.loading import LoadedModel, resolve_dtype


class HeadLM:
    """The target's LM head as a draft reads it: (n, H) states -> (n, V) logits, -inf off a
    restricted head's ids; `embed` maps ids to the target's embeddings."""

    def __init__(self, embed: torch.Tensor, head: torch.Tensor, vocab_size: int, head_ids: torch.Tensor | None):
        self.embed, self.vocab_size = embed, vocab_size
        self.head_ids = None if head_ids is None else check_head_ids(head_ids, vocab_size).to(head.device)
        self.weight = head[: self.vocab_size] if self.head_ids is None else head[self.head_ids].contiguous()
        # a restricted head is a copy already: packed as the target's linears are (runtime/kernels/linear.py);
        # the full head stays a view of the target's (no second 50 MB copy)
        self.linear = Linear(self.weight, self.head_ids is not None and packs(self.weight))

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """(n, H) -> (n, V)."""
        sub = self.linear(states)
        return sub if self.head_ids is None else scatter_head(sub, self.head_ids, self.vocab_size)


def shipped_head_dir(kind: str, target: LoadedModel) -> Path:
    """The folder of the `kind` module shipped for `target` (only the embedded default has them)."""
    folder = shipped_asset(kind_of(kind).asset, target.name)
    if folder is None or not (folder / HEAD_META).is_file():
        raise QuickdraftError(
            f"no {kind} drafter ships for target {target.name!r}; train one with "
            f"`quickdraft train-draft --kind {kind}` and pass --drafter {kind}:RUN/{kind}"
        )
    return folder


# targets whose decoder layers a draft module starts from (`models/draft_heads.init_from_target`: Llama's
# names and shapes); a Qwen2 layer's q/k/v biases are left out, the module's own block has none
MODULE_FAMILIES = ("llama", "mistral", "qwen2")


def _check_runtime(kind: str, target: LoadedModel, runtime: str) -> None:
    if forces_reference(runtime):
        raise QuickdraftError(f"the {kind} drafter reads the target's hidden states: use --runtime native or auto")
    reason = unsupported_reason(target.model)
    if reason is None and target.model.config.model_type not in MODULE_FAMILIES:
        reason = f"draft modules are built on the Llama block ({target.model.config.model_type} is not one)"
    if reason is not None:
        raise QuickdraftError(
            f"the {kind} drafter needs the native runtime, which does not support this target: {reason}"
        )


def reusing_builder(module_type: type, make: Callable) -> Callable:
    """The builder of a kind that runs a trained `module_type` through the target's LM head:
    `make(module, lm, eta, name)` is the kind's drafter (its record's `from_module`)."""

    def build(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str):
        kind = spec.kind
        _check_runtime(kind, target, runtime)
        folder = shipped_head_dir(kind, target) if spec.value is None else Path(spec.value).expanduser()
        own = resolve_dtype(dtype) if dtype else target.model.dtype
        module, head_ids, meta = load_draft_head(folder, module_type, target.model, own)
        embed = target.model.get_input_embeddings().weight.detach()
        head = target.model.get_output_embeddings().weight.detach()
        if own != target.model.dtype:
            embed, head = embed.to(own), head.to(own)
        lm = HeadLM(embed, head, target.vocab_size, head_ids)
        drafter = make(for_inference(module.to(embed.device)), lm, float(meta.get("eta", 0.6)), str(spec))
        if drafter.drafts_trees and meta.get("tree_gain"):  # measured by train-draft: sizes `draft_tree` auto
            drafter.tree_gain = {int(b): float(v) for b, v in meta["tree_gain"].items()}
            drafter.tree_gain_width = {int(b): int(w) for b, w in meta.get("tree_gain_width", {}).items()} or None
        return drafter

    return build
