"""Load Hugging Face causal LMs (and tokenizers) from local folders; check draft/target vocabularies.

Nothing here downloads: HF_HUB_OFFLINE is forced on. "default" (or None) names the embedded
SmolLM2-135M-Instruct, "gemma3-270m" Gemma 3 270M (an optional extra), "FILE.gguf" a GGUF file; each
is converted once by `weights.default`.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from quickdraft.config import DTYPES  # noqa: E402
from quickdraft.errors import QuickdraftError  # noqa: E402
from quickdraft.weights.default import converted_target  # noqa: E402


@dataclass
class LoadedModel:
    """A model, its tokenizer (None for in-process test models) and a display name.

    `head_ids` (K,) restricts a draft's LM head to K token ids (see CachedModel); None = all.
    `source` is the folder it was loaded from (where quantization reads float32 weights) and `gguf`
    the GGUF file that folder was converted from (the embedded default), if any; `trained` names the
    tensors a distilled delta replaced (quantization reads those from the model, not from the GGUF).
    """

    model: PreTrainedModel
    tokenizer: object | None
    name: str
    head_ids: torch.Tensor | None = None
    source: Path | None = None
    gguf: Path | None = None
    trained: frozenset[str] = frozenset()

    @property
    def output_vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def vocab_size(self) -> int:
        """The real vocabulary: the tokenizer's, else the model's output width."""
        return len(self.tokenizer) if self.tokenizer is not None else self.output_vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids: set[int] = set()
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return tuple(sorted(ids))


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise QuickdraftError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def load_model(path: str | None, dtype: str = "bfloat16") -> LoadedModel:
    """Load a local HF causal-LM folder (or "default") in `dtype` on CPU, in eval mode."""
    torch_dtype = resolve_dtype(dtype)
    hf_logging.disable_progress_bar()  # our own CLI output stays readable
    converted = converted_target(path)
    if converted is not None:
        folder, name, gguf = converted
    else:
        folder, name, gguf = Path(path).expanduser(), str(path), None
        if not folder.is_dir():
            raise QuickdraftError(f"model folder not found: {path}")
        if not (folder / "config.json").is_file():
            raise QuickdraftError(f"{path} is not a Hugging Face model folder (no config.json)")
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise QuickdraftError(f"cannot load a causal LM from {path}: {str(exc).splitlines()[0]}") from exc
    return LoadedModel(model=model.eval(), tokenizer=_tokenizer(folder), name=name, source=folder, gguf=gguf)


_TOKENIZERS: dict[tuple, object] = {}


def _tokenizer(folder: Path):
    """The folder's tokenizer or None, parsed once a process while its files are unchanged (a third of
    a second each time for the default model's): each caller gets its own shallow copy (its attributes
    its own, the Rust tokenizer shared, which encoding does not change)."""
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix not in (".safetensors", ".bin", ".gguf"))
    stamp = tuple((f.name, f.stat().st_mtime_ns) for f in files)
    key = (str(folder.resolve()), stamp)
    if key not in _TOKENIZERS:
        try:
            _TOKENIZERS[key] = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError):
            _TOKENIZERS[key] = None
    cached = _TOKENIZERS[key]
    return None if cached is None else copy.copy(cached)


def _no_init():
    """transformers' context that skips weight initialisation (torch's and its own), where it has one."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # an older transformers: initialise as before
        return contextlib.nullcontext()
    return no_init_weights()


def truncated_copy(target: LoadedModel, num_layers: int, dtype: torch.dtype | None = None) -> LoadedModel:
    """A draft made of the target's first `num_layers` decoder layers + final norm + LM head.

    A real-weights stand-in for a draft model (the weights are copied, the target is untouched),
    in `dtype` (default: the target's).
    """
    total = int(target.model.config.num_hidden_layers)
    if not 1 <= num_layers < total:
        raise QuickdraftError(f"truncated draft needs 1 <= layers < {total}, got {num_layers}")
    config = copy.deepcopy(target.model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    with _no_init():  # every weight is loaded next: a random init cost 1.4 s a copy of the default model
        draft = AutoModelForCausalLM.from_config(config, dtype=dtype or target.model.dtype)
    missing, _ = draft.load_state_dict(target.model.state_dict(), strict=False)
    if [m for m in missing if "rotary" not in m]:
        raise QuickdraftError(f"truncated copy is missing weights: {missing[:3]}")
    draft.generation_config = target.model.generation_config
    return LoadedModel(model=draft.eval(), tokenizer=target.tokenizer, name=f"{target.name}[:{num_layers}]")


PADDING = re.compile(r"\[PAD\d+\]")  # the names llama.cpp's converter gives a vocabulary's padded ids


def check_vocab(target: LoadedModel, draft: LoadedModel) -> int:
    """Return the shared vocabulary size, or raise if draft and target cannot be paired.

    Tokenizers (when both have one) must map the same strings to the same ids, apart from padding ids
    (`[PAD<id>]`, which llama.cpp's converter adds up to a model's embedding rows: a Qwen2.5 7B's 152,064
    against its 0.5B's 151,936); model output widths may differ by a padded tail but must cover the
    shared vocabulary. A draft narrower than the target's padded vocabulary proposes none of the padding
    ids (its head is restricted to its own rows: `draft_head`), which speculative sampling keeps exact.
    """
    padded = False
    if target.tokenizer is not None and draft.tokenizer is not None:
        tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
        if tv != dv:
            real_t, real_d = ({k: v for k, v in x.items() if not PADDING.fullmatch(k)} for x in (tv, dv))
            if real_t != real_d:
                diff = next((t for t in tv if dv.get(t) != tv[t]), None) or next(t for t in dv if t not in tv)
                raise QuickdraftError(
                    f"draft {draft.name} and target {target.name} do not share a vocabulary "
                    f"({len(dv)} vs {len(tv)} tokens; first difference: {diff!r})"
                )
            padded = True
        vocab = target.vocab_size
    elif target.output_vocab_size != draft.output_vocab_size:
        raise QuickdraftError(
            f"draft {draft.name} has {draft.output_vocab_size} output tokens, target {target.name} has "
            f"{target.output_vocab_size}; without tokenizers to compare they must be equal"
        )
    else:
        vocab = target.output_vocab_size
    for m in (target, draft):
        covers = m.output_vocab_size >= vocab or (padded and m is draft and _real_ids(m) <= m.output_vocab_size)
        if not covers:
            raise QuickdraftError(
                f"{m.name} has {m.output_vocab_size} output tokens, fewer than the vocabulary ({vocab})"
            )
    return vocab


def _real_ids(m: LoadedModel) -> int:
    """One past the highest id of `m`'s tokenizer that is not padding."""
    return 1 + max(i for t, i in m.tokenizer.get_vocab().items() if not PADDING.fullmatch(t))


def embedding_rows(draft: LoadedModel, vocab: int) -> int | None:
    """The draft's embedding rows where they are fewer than the shared vocabulary (a padded target's)."""
    rows = int(draft.model.get_input_embeddings().weight.shape[0])
    return rows if rows < vocab else None


def draft_head(draft: LoadedModel, vocab: int) -> torch.Tensor | None:
    """The draft's head ids over a `vocab`-wide output: its own restriction, else, where its head is
    narrower than `vocab` (a padded target's), its own rows (the rest scatter to -inf), else None."""
    if draft.head_ids is not None or draft.output_vocab_size >= vocab:
        return draft.head_ids
    return torch.arange(draft.output_vocab_size)
