"""Draft models to distil, and the compact "delta" form in which a distilled draft ships.

A student starts either from a truncated copy of the target (``truncated:N``: its first N layers,
final norm and the tied embedding/LM head, which stay frozen) or from a small config of the
target's architecture and vocabulary (``small:layers=N,hidden=H,intermediate=I,heads=A,kv_heads=K``,
randomly initialised, everything trained).

A distilled truncated student is shipped as a delta: only its trained tensors plus a small JSON
that names the target it belongs to. `load_delta` rebuilds the full draft from the target.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from quickdraft.errors import QuickdraftError
from quickdraft.models.loading import LoadedModel, truncated_copy

DELTA_WEIGHTS = "draft_delta.safetensors"
DELTA_META = "distilled.json"
DELTA_HEAD = "head_ids.safetensors"
SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "distilled"
SHIPPED_FOR = {"SmolLM2-135M-Instruct": "smollm2-135m-instruct"}


def shipped_delta_dir(target: LoadedModel) -> Path:
    """The delta folder shipped with the package for `target` (only the embedded default has one)."""
    key = SHIPPED_FOR.get(target.name)
    if key is None or not (SHIPPED / key / DELTA_META).is_file():
        raise QuickdraftError(
            f"no distilled draft ships for target {target.name!r}; train one with `quickdraft distill` "
            "and pass --drafter distilled:RUN/delta"
        )
    return SHIPPED / key


@dataclass
class Student:
    """The draft being trained and which of its tensors train."""

    loaded: LoadedModel
    init: str
    trainable: list[str]

    @property
    def model(self):
        return self.loaded.model


def _parse_kv(spec: str) -> dict[str, int]:
    out = {}
    for part in filter(None, spec.split(",")):
        k, _, v = part.partition("=")
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise QuickdraftError(f"bad student option {part!r}: expected key=integer") from None
    return out


def make_student(target: LoadedModel, init: str, dtype: torch.dtype = torch.float32) -> Student:
    """Build a trainable draft for `target` from an init spec (see module docstring)."""
    kind, _, arg = init.partition(":")
    if kind == "truncated":
        try:
            n = int(arg)
        except ValueError:
            raise QuickdraftError(f"truncated student needs a layer count, e.g. truncated:2, got {init!r}") from None
        loaded = truncated_copy(target, n)
        model = loaded.model.to(dtype)
        emb = model.get_input_embeddings().weight
        out = model.get_output_embeddings().weight
        emb.requires_grad_(False)
        out.requires_grad_(False)
    elif kind == "small":
        opts = _parse_kv(arg)
        known = {"layers", "hidden", "intermediate", "heads", "kv_heads"}
        if set(opts) - known:
            raise QuickdraftError(f"unknown small-student options {sorted(set(opts) - known)}; use {sorted(known)}")
        config = copy.deepcopy(target.model.config)
        config.num_hidden_layers = opts.get("layers", 2)
        config.hidden_size = opts.get("hidden", 256)
        config.intermediate_size = opts.get("intermediate", 4 * config.hidden_size)
        config.num_attention_heads = opts.get("heads", 4)
        config.num_key_value_heads = opts.get("kv_heads", config.num_attention_heads)
        config.head_dim = config.hidden_size // config.num_attention_heads
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[: config.num_hidden_layers]
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.generation_config = target.model.generation_config
        loaded = LoadedModel(model=model, tokenizer=target.tokenizer, name=f"{target.name}:small")
    else:
        raise QuickdraftError(f"unknown student init {init!r}; use truncated:N or small:layers=N,hidden=H,...")
    loaded.model.train()
    if hasattr(loaded.model.config, "use_cache"):
        loaded.model.config.use_cache = True
    names = [n for n, p in loaded.model.named_parameters() if p.requires_grad]
    return Student(loaded=loaded, init=init, trainable=names)


def rank_tokens(responses: Iterable[Sequence[int]], always: Iterable[int] = ()) -> torch.Tensor:
    """Token ids by decreasing frequency in `responses` (ties: lower id first), `always` ids first: (n,)."""
    counts = Counter(t for r in responses for t in r)
    first = list(dict.fromkeys(int(t) for t in always))
    rest = sorted((t for t in counts if t not in set(first)), key=lambda t: (-counts[t], t))
    return torch.tensor(first + rest, dtype=torch.long)


def save_delta(
    student: Student,
    folder: Path,
    meta: dict,
    dtype: torch.dtype = torch.bfloat16,
    head_ids: torch.Tensor | None = None,
) -> Path:
    """Write the trained tensors of a truncated student (+ meta) to `folder`; returns the folder.

    head_ids: (K,) token ids the draft's LM head is restricted to at inference (None: all); the
    training is unchanged, only drafting uses the K rows (see CachedModel).
    """
    if not student.init.startswith("truncated:"):
        raise QuickdraftError("only truncated students ship as a delta; save a small student as a full folder")
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(student.model.named_parameters())
    tensors = {n: params[n].detach().to(dtype).contiguous() for n in student.trainable}
    save_file(tensors, str(folder / DELTA_WEIGHTS))
    cfg = student.model.config
    full = {
        "init": student.init,
        "num_layers": int(cfg.num_hidden_layers),
        "hidden_size": int(cfg.hidden_size),
        "vocab_size": int(student.model.get_output_embeddings().weight.shape[0]),
        "model_type": cfg.model_type,
        **meta,
    }
    if head_ids is not None:
        save_file({"head_ids": head_ids.to(torch.int64).contiguous()}, str(folder / DELTA_HEAD))
        full["head_vocab"] = int(head_ids.numel())
    else:
        (folder / DELTA_HEAD).unlink(missing_ok=True)
    (folder / DELTA_META).write_text(json.dumps(full, indent=2) + "\n")
    return folder


def load_delta(target: LoadedModel, folder: Path, dtype: torch.dtype | None = None) -> LoadedModel:
    """Rebuild a distilled truncated draft for `target` from a delta folder (default: the target's dtype)."""
    meta_path = folder / DELTA_META
    if not meta_path.is_file() or not (folder / DELTA_WEIGHTS).is_file():
        raise QuickdraftError(f"{folder} holds no distilled draft ({DELTA_META} + {DELTA_WEIGHTS})")
    meta = json.loads(meta_path.read_text())
    cfg = target.model.config
    mine = {
        "hidden_size": int(cfg.hidden_size),
        "vocab_size": target.output_vocab_size,
        "model_type": cfg.model_type,
    }
    wrong = {k: (meta.get(k), v) for k, v in mine.items() if meta.get(k) != v}
    if wrong:
        raise QuickdraftError(
            f"the distilled draft in {folder} was trained for another target "
            f"({', '.join(f'{k}: draft {a} vs target {b}' for k, (a, b) in wrong.items())})"
        )
    draft = truncated_copy(target, int(meta["num_layers"]), dtype)
    tensors = load_file(str(folder / DELTA_WEIGHTS))
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
    if (folder / DELTA_HEAD).is_file():
        draft.head_ids = load_file(str(folder / DELTA_HEAD))["head_ids"].long()
    return draft
