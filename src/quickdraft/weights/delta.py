"""The compact "delta" format a distilled draft ships in, and where shipped drafts live.

A distilled draft is stored as only its trained tensors (`draft_delta.safetensors`), an optional
restricted-head id list (`head_ids.safetensors`) and a JSON (`distilled.json`) naming its base,
`init`: `truncated:N` (the target's first N layers; the JSON names the target's shape, checked) or
`model:NAME|PATH` (an independent draft model of the target's vocabulary, e.g. the 0.5B beside the
Qwen 1.5B); `load_delta` rebuilds the full draft from that base. The format's writer
(`write_delta`) and reader (`load_delta`) live here together; training calls the writer
(`training/student.save_delta`), so inference never imports training code.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quickdraft.errors import QuickdraftError
from quickdraft.spec_options import STUDENT_OPTIONS, parse_options
from quickdraft.weights import weight_files
from quickdraft.weights.loading import LoadedModel, check_vocab, load_model, truncated_copy

DELTA_WEIGHTS = "draft_delta.safetensors"
DELTA_META = "distilled.json"
DELTA_HEAD = "head_ids.safetensors"
SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "distilled"
SHIPPED_FOR = {"SmolLM2-135M-Instruct": "smollm2-135m-instruct"}


def write_delta(folder: Path, tensors: dict[str, torch.Tensor], meta: dict, head_ids: torch.Tensor | None) -> Path:
    """Write a delta: the trained `tensors` (name -> tensor, as the draft model names them), the JSON
    `meta` (the student's init and shape and what trained it: `load_delta` reads it) and the optional
    (K,) restricted-head ids (None: a full head; a stale list is removed). Returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(folder / DELTA_WEIGHTS))
    meta = dict(meta)
    if head_ids is not None:
        save_file({"head_ids": head_ids.to(torch.int64).contiguous()}, str(folder / DELTA_HEAD))
        meta["head_vocab"] = int(head_ids.numel())
    else:
        (folder / DELTA_HEAD).unlink(missing_ok=True)
    (folder / DELTA_META).write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def shipped_delta_dir(target: LoadedModel) -> Path:
    """The delta folder shipped with the package for `target` (only the embedded default has one)."""
    key = SHIPPED_FOR.get(target.name)
    if key is None or not (SHIPPED / key / DELTA_META).is_file():
        raise QuickdraftError(
            f"no distilled draft ships for target {target.name!r}; train one with `quickdraft distill` "
            "and pass --drafter distilled:RUN/delta"
        )
    return SHIPPED / key


def _base(target: LoadedModel, base: str, folder: Path, meta: dict, dtype: torch.dtype | None) -> LoadedModel:
    """The model a delta's tensors go into, checked against what the delta was trained on."""
    if base.startswith("model:"):
        path, _ = parse_options(f"delta base {base!r}", base.removeprefix("model:"), STUDENT_OPTIONS)  # ;train=N
        draft = load_model(path, str(dtype or target.model.dtype).removeprefix("torch."))
        check_vocab(target, draft)
        mine = {"hidden_size": int(draft.model.config.hidden_size), "num_layers": draft.model.config.num_hidden_layers}
        what = f"another base than {base}"
    else:  # a truncated copy of the target, made once the delta is known to fit it
        draft, cfg = None, target.model.config
        mine = {
            "hidden_size": int(cfg.hidden_size),
            "vocab_size": target.output_vocab_size,
            "model_type": cfg.model_type,
        }
        what = "another target"
    wrong = {k: (meta.get(k), v) for k, v in mine.items() if meta.get(k) != v}
    if wrong:
        raise QuickdraftError(
            f"the distilled draft in {folder} was trained for {what} "
            f"({', '.join(f'{k}: draft {a} vs {b}' for k, (a, b) in wrong.items())})"
        )
    return draft if draft is not None else truncated_copy(target, int(meta["num_layers"]), dtype)


def _delta_meta(folder: Path) -> dict:
    """A delta folder's JSON, once its tensors are known to be there."""
    meta_path = folder / DELTA_META
    if not meta_path.is_file() or not (folder / DELTA_WEIGHTS).is_file():
        raise QuickdraftError(f"{folder} holds no distilled draft ({DELTA_META} + {DELTA_WEIGHTS})")
    return json.loads(meta_path.read_text())


def _named_base(meta: dict) -> str:
    return str(meta.get("init", f"truncated:{meta.get('num_layers')}"))


def delta_base(folder: Path) -> str:
    """The base a delta folder's JSON names: `truncated:N` (the target's first N layers) or `model:NAME`."""
    return _named_base(_delta_meta(folder))


def load_delta(target: LoadedModel, folder: Path, dtype: torch.dtype | None = None) -> LoadedModel:
    """Rebuild a distilled draft for `target` from a delta folder (default: the target's dtype), on the
    base its JSON names (a truncated copy of the target, or the named draft model)."""
    meta = _delta_meta(folder)
    draft = _base(target, _named_base(meta), folder, meta, dtype)
    tensors = weight_files.read(folder / DELTA_WEIGHTS)  # bfloat16, or packed int8/int4 (the shipped one)
    own = dict(draft.model.named_parameters())
    missing = [n for n in tensors if n not in own]
    if missing:
        raise QuickdraftError(f"distilled draft has tensors the model lacks: {missing[:3]}")
    with torch.no_grad():
        for n, t in tensors.items():
            if own[n].shape != t.shape:
                raise QuickdraftError(
                    f"distilled tensor {n} has shape {tuple(t.shape)}, expected {tuple(own[n].shape)}"
                )
            own[n].copy_(t.to(own[n].dtype))
    draft.name = f"distilled[{folder.name}]"
    draft.trained = frozenset(tensors)  # a GGUF base's blocks of these are stale: quantize the trained values
    if (folder / DELTA_HEAD).is_file():
        draft.head_ids = load_file(str(folder / DELTA_HEAD))["head_ids"].long()
    return draft
