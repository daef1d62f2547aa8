"""The SeqKD corpus: the target's own responses (`../shared/data/seqkd/`, format in its README).

One JSON object a line in `seqkd-*.jsonl.gz`: `prompt_ids` (chat-templated, generation prompt
included), `response_ids`, `split` ("train" | "heldout", the project's hash rule), `mode`
("greedy" | "sample"). Rows are read whole into memory (5.4M tokens: small).
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.errors import QuickdraftError


@dataclass(frozen=True)
class Row:
    prompt: tuple[int, ...]
    response: tuple[int, ...]
    mode: str


def read_seqkd(folder: Path, split: str, modes: Sequence[str] = ("greedy", "sample")) -> list[Row]:
    """All rows of `split` whose mode is in `modes`, in file order."""
    files = sorted(Path(folder).glob("seqkd-*.jsonl.gz"))
    if not files:
        raise QuickdraftError(f"{folder} holds no SeqKD corpus (seqkd-*.jsonl.gz)")
    rows = []
    for path in files:
        with gzip.open(path, "rt") as f:
            for line in f:
                record = json.loads(line)
                if record["split"] == split and record["mode"] in modes and record["response_ids"]:
                    rows.append(Row(tuple(record["prompt_ids"]), tuple(record["response_ids"]), record["mode"]))
    if not rows:
        raise QuickdraftError(f"{folder}: no {split} rows of mode {', '.join(modes)}")
    return rows


def shuffled(rows: list[Row], seed: int) -> list[Row]:
    order = list(rows)
    random.Random(seed).shuffle(order)
    return order


def window(row: Row, max_len: int) -> tuple[list[int], int]:
    """(ids, prompt length): the prompt and as much of the response as fits in max_len; a long
    prompt keeps its last tokens (at least a quarter of the window goes to the response)."""
    keep_prompt = min(len(row.prompt), max_len - max(1, max_len // 4))
    prompt = list(row.prompt[len(row.prompt) - keep_prompt :])
    return (prompt + list(row.response))[:max_len], len(prompt)


def response_mask(lengths: Sequence[int], prompt_lens: Sequence[int], width: int, shift: int = 0) -> torch.Tensor:
    """(B, width) bool: row b, column t is True when position t + shift holds a distribution over a
    response token, i.e. prompt_len - 1 <= t + shift <= length - 1 (the last row predicts past the
    end, which is still the target's distribution there)."""
    t = torch.arange(width)[None, :] + shift
    lo = torch.tensor([p - 1 for p in prompt_lens])[:, None]
    hi = torch.tensor([n - 1 for n in lengths])[:, None]
    return (t >= lo) & (t <= hi)


def hard_labels(folder: Path, max_len: int = 1024) -> tuple[list, list[int], list[torch.Tensor], list[torch.Tensor]]:
    """A SeqKD corpus's greedy train rows as a top-1 cache (`training/cache.CachedData` reads it so):
    (sequences, prompt lengths, per sequence the (n, 1) next-token ids at its n scored positions and
    their (n, 1) log-probabilities, all 0). At temperature 0 the target's law is one-hot on the token it
    chose, so forward KL against it is the cross-entropy of the draft on the target's own outputs."""
    seqs, prompt_lens, ids, logp = [], [], [], []
    for row in read_seqkd(folder, "train", ("greedy",)):
        seq, plen = window(row, max_len)
        seqs.append(seq)
        prompt_lens.append(plen)
        nxt = torch.tensor(seq[plen:], dtype=torch.long)[:, None]  # position plen-1+i predicts seq[plen+i]
        ids.append(nxt)
        logp.append(torch.zeros(nxt.shape))
    return seqs, prompt_lens, ids, logp
