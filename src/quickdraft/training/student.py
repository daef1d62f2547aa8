"""Draft models to distil, and the compact "delta" form in which a distilled draft ships.

A student starts either from a truncated copy of the target (``truncated:N``: its first N layers,
final norm and the tied embedding/LM head, which stay frozen) or from a small config of the
target's architecture and vocabulary (``small:layers=N,hidden=H,intermediate=I,heads=A,kv_heads=K``,
randomly initialised, everything trained), or from an independent draft model of the target's
vocabulary (``model:NAME|PATH[;train=N]``: e.g. ``model:qwen2.5-coder-0.5b;train=4`` for the 1.5B; its
embedding and LM head frozen, its layers trained, or only its last N and its final norm).

A distilled truncated or model-born student is shipped as a delta naming its base (`save_delta`; the
format, its writer and reader, `write_delta` and `load_delta`, live in `weights/delta.py`).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from quickdraft.errors import QuickdraftError
from quickdraft.spec_options import STUDENT_OPTIONS, parse_options
from quickdraft.weights.delta import write_delta
from quickdraft.weights.loading import LoadedModel, check_vocab, load_model, truncated_copy


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


def model_init(init: str) -> tuple[str, int | None]:
    """`model:NAME|PATH[;train=N]` -> (NAME|PATH, N or None: every layer trains)."""
    path, values = parse_options(f"student {init!r}", init.removeprefix("model:"), STUDENT_OPTIONS)
    if not path:
        raise QuickdraftError("a model student needs a name or a folder: model:NAME|PATH[;train=N]")
    return path, values.get("train")


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
    elif kind == "model":
        path, last = model_init(init)
        loaded = load_model(path, str(dtype).removeprefix("torch."))
        check_vocab(target, loaded)  # the draft must read and write the target's ids
        model = loaded.model
        model.get_input_embeddings().weight.requires_grad_(False)
        model.get_output_embeddings().weight.requires_grad_(False)
        if last is not None:  # only the last layers (and the final norm) train: the delta holds them alone
            layers = int(model.config.num_hidden_layers)
            if not 1 <= last <= layers:
                raise QuickdraftError(f"{init!r}: train=N needs 1 <= N <= the draft's {layers} layers")
            for i in range(layers - last):
                model.get_decoder().layers[i].requires_grad_(False)
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
        raise QuickdraftError(
            f"unknown student init {init!r}; use truncated:N, model:NAME|PATH or small:layers=N,hidden=H,..."
        )
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


def draft_head_ids(responses: Iterable[Sequence[int]], eos_ids: Iterable[int], k: int, target_name: str):
    """A distilled draft's K head ids: the most frequent response tokens, EOS ids first, then (where the
    data saw fewer ids and a ranking ships for the target, `;vocab=K`'s) the target's next most frequent:
    (K,). 1,296 of the Qwen 1.5B's answers hold 11,108 distinct ids."""
    from quickdraft.drafters.draft_models.vocab import VOCAB_FOR, ranked_ids

    ids = rank_tokens(responses, sorted(eos_ids))[:k]
    if len(ids) < k and target_name in VOCAB_FOR:
        seen = set(ids.tolist())
        more = [t for t in ranked_ids(target_name, str(k)).tolist() if t not in seen]  # the whole shipped ranking
        ids = torch.cat([ids, torch.tensor(more[: k - len(ids)], dtype=torch.long)])
    return ids


def save_delta(
    student: Student,
    folder: Path,
    meta: dict,
    dtype: torch.dtype = torch.bfloat16,
    head_ids: torch.Tensor | None = None,
) -> Path:
    """Write the trained tensors of a truncated or model-born student (+ meta naming its base, `init`)
    to `folder`; returns the folder.

    head_ids: (K,) token ids the draft's LM head is restricted to at inference (None: all); the
    training is unchanged, only drafting uses the K rows (see CachedModel).
    """
    if not student.init.startswith(("truncated:", "model:")):
        raise QuickdraftError("only truncated and model-born students ship as a delta; save a small one as a folder")
    params = dict(student.model.named_parameters())
    tensors = {n: params[n].detach().to(dtype) for n in student.trainable}
    cfg = student.model.config
    full = {
        "init": student.init,
        "num_layers": int(cfg.num_hidden_layers),
        "hidden_size": int(cfg.hidden_size),
        "vocab_size": int(student.model.get_output_embeddings().weight.shape[0]),
        "model_type": cfg.model_type,
        **meta,
    }
    return write_delta(folder, tensors, full, head_ids)
