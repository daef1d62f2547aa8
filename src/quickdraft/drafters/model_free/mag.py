"""MaG ("Max-Gram"), CS Drafting's statistical bottom drafter (arXiv 2312.11462, code mag.py).

1. the longest suffix n-gram match in the prompt and the generated text, copying what followed it
   (prompt lookup);
2. the rest filled from a greedy bigram table, next[token] = the token that most often follows
   `token` in the target's own text (built from a SeqKD corpus by `quickdraft build-bigram`, 4 bytes
   per vocabulary entry, -1 where a token was never followed).

Deterministic and model-free (q_probs None; its cost is counted as 0, as in the paper).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import Drafter, DraftRequest, draft_path
from quickdraft.drafters.kinds import DrafterKind, DrafterSpec, shipped_asset
from quickdraft.drafters.model_free.ngram import prompt_lookup
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers.tree import TokenTree

BIGRAM_FILE = "bigram.safetensors"


def build_bigram(sequences: Iterable[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """(V,) int32: the most frequent successor of every token over `sequences` (ties: the lower id),
    -1 for tokens never followed."""
    keys = [
        np.asarray(seq[:-1], dtype=np.int64) * vocab_size + np.asarray(seq[1:], dtype=np.int64)
        for seq in sequences
        if len(seq) > 1
    ]
    best = np.full(vocab_size, -1, dtype=np.int32)
    if keys:
        uniq, counts = np.unique(np.concatenate(keys), return_counts=True)
        token, successor = np.divmod(uniq, vocab_size)
        order = np.lexsort((successor, -counts, token))  # by token, most frequent first, then lower id
        first = np.ones(order.size, dtype=bool)
        first[1:] = token[order][1:] != token[order][:-1]
        best[token[order][first]] = successor[order][first]
    return torch.from_numpy(best)


def shipped_bigram(target) -> Path | None:
    """The bigram file shipped for `target` (only the embedded default has one), else None."""
    folder = shipped_asset(KIND.asset, target.name)
    return None if folder is None or not (folder / BIGRAM_FILE).is_file() else folder / BIGRAM_FILE


def save_bigram(table: torch.Tensor, folder: Path, meta: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"next_token": table.to(torch.int32).contiguous()}, str(folder / BIGRAM_FILE), metadata=meta)
    return folder / BIGRAM_FILE


def load_bigram(path: Path, vocab_size: int) -> torch.Tensor:
    """The (V,) table of a bigram file (or of a folder holding one), checked against the vocabulary."""
    path = path / BIGRAM_FILE if path.is_dir() else path
    if not path.is_file():
        raise QuickdraftError(f"{path} holds no bigram table; build one with `quickdraft build-bigram`")
    table = load_file(str(path))["next_token"].to(torch.long)
    if table.numel() != vocab_size:
        raise QuickdraftError(f"the bigram table {path} covers {table.numel()} tokens, the target has {vocab_size}")
    return table


class MaGDrafter(Drafter):
    """Prompt lookup, then the bigram chain, up to k tokens (name "mag")."""

    def __init__(self, table: torch.Tensor | None, max_ngram: int = 3, name: str = "mag") -> None:
        self.table, self.max_ngram, self.name = table, max_ngram, name

    def fork(self) -> MaGDrafter:
        """Stateless: every row of a batch can share this one."""
        return self

    def draft(self, context: Sequence[int], k: int) -> list[int]:
        tokens = prompt_lookup(context, k, self.max_ngram, 1) if len(context) > 1 else []
        last = tokens[-1] if tokens else (context[-1] if context else -1)
        while len(tokens) < k and self.table is not None and 0 <= last < self.table.numel():
            last = int(self.table[last])
            if last < 0:
                break
            tokens.append(last)
        return tokens

    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        self.refuse_tree(request)
        return draft_path(self.draft(context, request.budget)) if request.budget >= 1 else TokenTree()


def _build(spec: DrafterSpec, target, dtype: str, runtime: str) -> MaGDrafter:
    """MaG with the bigram table at PATH, else the one shipped for the target (none: lookup only)."""
    if spec.value is not None:
        return MaGDrafter(load_bigram(Path(spec.value).expanduser(), target.vocab_size), name=str(spec))
    shipped = shipped_bigram(target)
    return MaGDrafter(None if shipped is None else load_bigram(shipped, target.vocab_size), name=str(spec))


KIND = DrafterKind(
    name="mag",
    usage="mag[:PATH]",
    summary="CS Drafting's MaG: prompt lookup, then a bigram table of the target's text",
    build=_build,
    has_model=False,
    trained_by="build-bigram",
    asset="bigram",
)
