"""The files a trained draft module ships in, written and read here: `draft_head.safetensors` (its
weights: bfloat16, or packed int8/int4 by `weights/weight_files.py`), `draft_head.json` (its
`DraftHeadConfig` and provenance) and an optional restricted head `head_ids.safetensors` (K,) int64.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from quickdraft.errors import QuickdraftError
from quickdraft.models.draft_heads import DraftHeadConfig
from quickdraft.weights import weight_files

HEAD_WEIGHTS = "draft_head.safetensors"
HEAD_META = "draft_head.json"
HEAD_IDS = "head_ids.safetensors"


def save_draft_head(folder: Path, module: nn.Module, head_ids: torch.Tensor | None, meta: dict) -> Path:
    """Write a trained module (bfloat16), its restricted head ids (K,) and its provenance `meta`."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(folder / HEAD_WEIGHTS))
    if head_ids is not None:
        save_file({"head_ids": head_ids.to(torch.int64).contiguous()}, str(folder / HEAD_IDS))
    (folder / HEAD_META).write_text(json.dumps({"config": config_dict(module.cfg), **meta}, indent=2) + "\n")
    return folder


def load_draft_head(
    folder: Path, module_type: type[nn.Module], model, dtype: torch.dtype
) -> tuple[nn.Module, torch.Tensor | None, dict]:
    """(module of `module_type` in eval mode, restricted head ids or None, meta) from a trained
    module's folder, checked against the target `model` it must belong to."""
    kind = module_type.kind
    meta_path = folder / HEAD_META
    if not meta_path.is_file() or not (folder / HEAD_WEIGHTS).is_file():
        raise QuickdraftError(f"{folder} holds no trained draft module ({HEAD_META} + {HEAD_WEIGHTS})")
    meta = json.loads(meta_path.read_text())
    cfg = DraftHeadConfig(**meta["config"])
    if cfg.kind != kind:
        raise QuickdraftError(f"{folder} holds a {cfg.kind!r} module, not a {kind!r} one")
    mine = DraftHeadConfig.from_target(model, kind, cfg.exit_layer or 2, cfg.block or 4)
    checks = ("hidden", "heads", "kv_heads", "head_dim", "vocab_size")
    wrong = [
        f"{k}: module {getattr(cfg, k)} vs target {getattr(mine, k)}"
        for k in checks
        if getattr(cfg, k) != getattr(mine, k)
    ]
    if wrong:
        raise QuickdraftError(f"the draft module in {folder} was trained for another target ({', '.join(wrong)})")
    module = module_type(cfg)
    module.load_state_dict(weight_files.read(folder / HEAD_WEIGHTS))  # bfloat16, or packed int8/int4
    head_ids = load_file(str(folder / HEAD_IDS))["head_ids"] if (folder / HEAD_IDS).is_file() else None
    return module.to(dtype).eval().requires_grad_(False), head_ids, meta


def config_dict(cfg: DraftHeadConfig) -> dict:
    return asdict(cfg)
