"""Suffix datastores on disk: the target's own text, compressed, and its index built once into the cache.

A datastore folder holds `tokens.npy.xz` (the documents joined by SEP, as uint16 when the vocabulary
fits, xz-compressed: the default target's 5.9M tokens take 3.9 MB) and `datastore.json` (provenance:
source, rows, tokens, vocabulary size, sha256 of the token bytes). The suffix array (4 bytes a token)
is built at first use or by `quickdraft prepare` into `<cache>/suffix/<sha256>/` and memory-mapped
from then on, so loading takes milliseconds.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import sys
import time
from pathlib import Path

import numpy as np

from quickdraft.drafters.kinds import ASSETS, shipped_asset
from quickdraft.drafters.model_free.suffix_index import SEP, SuffixIndex, reversed_suffix_array
from quickdraft.errors import QuickdraftError

TOKENS_FILE = "tokens.npy.xz"
META_FILE = "datastore.json"
SHIPPED_DATASTORES = ASSETS / "suffix"
# targets that ship a datastore of their own outputs but none of the default's other assets (its key
# under assets/suffix): the Qwen2.5-Coder 1.5B's greedy answers to SeqKD's ShareGPT prompts
OWN_OUTPUTS = {"Qwen2.5-Coder-1.5B-Instruct": "qwen2.5-coder-1.5b-instruct"}
U16_SEP = np.iinfo(np.uint16).max


def _encode(tokens: np.ndarray) -> bytes:
    """The token stream as .npy bytes (uint16 with SEP as 65535 when every id fits)."""
    small = tokens.size == 0 or int(tokens.max()) < U16_SEP
    array = np.where(tokens == SEP, U16_SEP, tokens).astype(np.uint16) if small else tokens.astype(np.int32)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _decode(raw: bytes) -> np.ndarray:
    array = np.load(io.BytesIO(raw), allow_pickle=False)
    if array.dtype == np.uint16:
        return np.where(array == U16_SEP, SEP, array.astype(np.int32)).astype(np.int32)
    return array.astype(np.int32)


def save_datastore(tokens: np.ndarray, folder: Path, meta: dict) -> Path:
    """Write a datastore folder (tokens: (N,) int32 documents joined by SEP); returns the folder."""
    raw = _encode(tokens)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TOKENS_FILE).write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    info = {**meta, "tokens": int(tokens.size), "sha256": hashlib.sha256(raw).hexdigest()}
    (folder / META_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return folder


def read_meta(folder: Path) -> dict:
    path = folder / META_FILE
    if not (path.is_file() and (folder / TOKENS_FILE).is_file()):
        raise QuickdraftError(
            f"{folder} holds no suffix datastore ({TOKENS_FILE}, {META_FILE}); build one with "
            "`quickdraft build-datastore`"
        )
    return json.loads(path.read_text())


def index_dir(meta: dict) -> Path:
    from quickdraft.host import cache_dir

    return cache_dir() / "suffix" / meta["sha256"][:32]


def load_datastore(folder: Path, vocab_size: int | None = None, quiet: bool = False) -> SuffixIndex:
    """The datastore's index, memory-mapped from the cache (built there on first use, ~1 s per
    million tokens). Refuses a datastore made for a larger vocabulary than `vocab_size`."""
    folder = Path(folder).expanduser()
    meta = read_meta(folder)
    if vocab_size is not None and meta.get("vocab_size", 0) > vocab_size:
        raise QuickdraftError(
            f"the datastore {folder} was built for a vocabulary of {meta['vocab_size']}, the target has {vocab_size}"
        )
    cached = index_dir(meta)
    tokens_path, order_path = cached / "tokens.npy", cached / "order.npy"
    if not order_path.is_file():
        start = time.perf_counter()
        if not quiet:
            print(
                f"quickdraft: indexing the suffix datastore {folder} ({meta['tokens']:,} tokens) once ...",
                file=sys.stderr,
                flush=True,
            )
        raw = lzma.decompress((folder / TOKENS_FILE).read_bytes())
        if hashlib.sha256(raw).hexdigest() != meta["sha256"]:
            raise QuickdraftError(f"the datastore {folder} is corrupt: its tokens do not match {META_FILE}")
        tokens = _decode(raw)
        order = reversed_suffix_array(tokens)
        cached.mkdir(parents=True, exist_ok=True)
        for path, array in ((tokens_path, tokens), (order_path, order)):
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, array)
            tmp.replace(path)
        if not quiet:
            print(f"quickdraft: indexed in {time.perf_counter() - start:.1f} s into {cached}", file=sys.stderr)
    return SuffixIndex(np.load(tokens_path, mmap_mode="r"), np.load(order_path, mmap_mode="r"))


def shipped_datastore(target) -> Path | None:
    """The datastore folder shipped for `target` (the embedded default's, or one of `OWN_OUTPUTS`),
    else None."""
    folder = shipped_asset(SHIPPED_DATASTORES.name, target.name)
    if folder is None and target.name in OWN_OUTPUTS:
        folder = SHIPPED_DATASTORES / OWN_OUTPUTS[target.name]
    return folder if folder is not None and (folder / META_FILE).is_file() else None
