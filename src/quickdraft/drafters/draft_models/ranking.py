"""Token ids ranked by frequency for any tokenizer, from text the project ships: the restricted head of
a draft model's fast form (`model:PATH` with no `;vocab=`) on a target nobody made a ranking for.

The text is the embedded default's suffix datastore (`assets/suffix/smollm2-135m-instruct`: SmolLM2's own
answers to SeqKD's ShareGPT prompts, the train split; never a benchmark set). Its first `SOURCE_TOKENS`
tokens are decoded with SmolLM2's tokenizer, re-encoded with the given one and counted. The ranking is
kept in the cache folder under a hash of the tokenizer's vocabulary (its content, not a model's name), so
a draft given by path and the same draft given by name share it, and it is made once per tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from quickdraft.drafters.model_free.datastore import SHIPPED_DATASTORES, TOKENS_FILE, _decode
from quickdraft.drafters.model_free.suffix_index import SEP
from quickdraft.errors import QuickdraftError

SOURCE = SHIPPED_DATASTORES / "smollm2-135m-instruct"
SOURCE_TOKENS = 2_000_000  # ~0.3 s a 100k tokens to re-encode; the top 32k ids are stable well before this
RANKED = "ranked_ids.safetensors"


def vocab_key(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary (token -> id), its identity for rankings."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]


def _source_texts(limit: int = SOURCE_TOKENS) -> list[str]:
    """The shipped text as documents, SmolLM2's token ids decoded (the first `limit` tokens)."""
    from transformers import AutoTokenizer

    from quickdraft.weights.default import ensure_default_model

    tokens = _decode(lzma.decompress((SOURCE / TOKENS_FILE).read_bytes()))[:limit]
    cuts = np.flatnonzero(tokens == SEP)
    docs = [d for d in np.split(tokens, cuts) if d.size]
    docs = [d[1:] if d[0] == SEP else d for d in docs]
    smol = AutoTokenizer.from_pretrained(ensure_default_model(), local_files_only=True)
    return smol.batch_decode([d.tolist() for d in docs if d.size], skip_special_tokens=True)


def rank_ids(tokenizer, texts: list[str]) -> torch.Tensor:
    """(R,) int64 ids seen in `texts` encoded by `tokenizer`, most frequent first (ties: lower id first)."""
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    for start in range(0, len(texts), 512):
        for ids in tokenizer(texts[start : start + 512], add_special_tokens=False)["input_ids"]:
            counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=counts.size)[: counts.size]
    seen = np.flatnonzero(counts)
    order = seen[np.lexsort((seen, -counts[seen]))]
    return torch.from_numpy(order.astype(np.int64))


def ranked_for(tokenizer) -> torch.Tensor:
    """(R,) int64 ids, most frequent first, for `tokenizer`: kept in the cache by its vocabulary's hash,
    made from the shipped text the first time (a few seconds, said on stderr)."""
    from quickdraft.host import cache_dir

    if tokenizer is None:
        raise QuickdraftError("a restricted draft head needs the target's tokenizer to rank its ids")
    path = cache_dir() / "vocab" / vocab_key(tokenizer) / RANKED
    if path.is_file():
        return load_file(str(path))["ranked"].to(torch.long)
    start = time.perf_counter()
    print("quickdraft: ranking this tokenizer's ids on the shipped text once ...", file=sys.stderr, flush=True)
    ranked = rank_ids(tokenizer, _source_texts())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    save_file({"ranked": ranked.to(torch.int32)}, str(tmp), metadata={"source": str(SOURCE.name)})
    tmp.replace(path)
    print(f"quickdraft: ranked {ranked.numel():,} ids in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return ranked
