"""`quickdraft build-datastore`: the suffix drafter's datastore from the target's own generations.

    quickdraft build-datastore --data ../shared/data/seqkd --output runs/datastore
    quickdraft generate "..." --drafter suffix:runs/datastore --draft-tree 16

`--data` takes a SeqKD corpus folder (`seqkd-*.jsonl.gz`: train rows only, the held-out split stays
out), a `distill-data` cache folder made with `--source target`, or a jsonl(.gz) file of generations
(`response_ids`, with `prompt_ids` optional; rows with a `split` other than train are skipped).
Each document is the last `--prompt-tail` prompt tokens and the response. Benchmark outputs
(rows with a `question_id`: Spec-Bench, HumanEval) are refused: a datastore never holds test text.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from quickdraft.errors import QuickdraftError


def add_datastore_parser(sub) -> None:
    d = sub.add_parser("build-datastore", help="the suffix drafter's datastore from the target's own generations")
    d.add_argument("--data", required=True, help="SeqKD folder, distill-data cache folder, or a jsonl(.gz) file")
    d.add_argument("--output", required=True, help="datastore folder (use with --drafter suffix:FOLDER)")
    d.add_argument(
        "--target", default=None, help="local HF model folder the text came from (default: the embedded model)"
    )
    d.add_argument("--prompt-tail", type=int, default=32, help="prompt tokens kept before each response")
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=cmd_build_datastore)


def _jsonl_rows(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise QuickdraftError(f"{path}:{number}: not a JSON line") from None
            if "question_id" in row:
                raise QuickdraftError(
                    f"{path}:{number}: a benchmark row (question_id): a datastore never holds test text"
                )
            if not isinstance(row.get("response_ids"), list):
                raise QuickdraftError(f"{path}:{number}: no response_ids list")
            yield row


def _documents(data: Path, tail: int) -> tuple[list[Path], Iterator[list[int]]]:
    """The input files and their documents (prompt tail + response), train split only."""
    if data.is_dir() and (data / "cache.json").is_file():
        from quickdraft.training.cache import CachedData

        cache = CachedData([data])
        if "target" not in cache.source.split("+"):
            raise QuickdraftError(f"{data} caches reference text (source {cache.source}), not the target's own text")
        docs = (ids[max(0, p - tail) :] for ids, p in zip(cache.sequences, cache.prompt_lens, strict=True))
        return [data], docs
    files = sorted(data.glob("seqkd-*.jsonl.gz")) if data.is_dir() else [data]
    if not files or not all(f.is_file() for f in files):
        raise QuickdraftError(f"--data {data}: no SeqKD corpus, distill-data cache or jsonl file there")

    def rows() -> Iterator[list[int]]:
        for path in files:
            for row in _jsonl_rows(path):
                if row.get("split", "train") == "train" and row["response_ids"]:
                    prompt = list(row.get("prompt_ids") or [])
                    yield prompt[len(prompt) - min(tail, len(prompt)) :] + list(row["response_ids"])

    return files, rows()


def cmd_build_datastore(args: argparse.Namespace) -> int:
    import numpy as np

    from quickdraft.drafters.model_free.datastore import load_datastore, save_datastore
    from quickdraft.drafters.model_free.suffix_index import concat_documents
    from quickdraft.weights.loading import load_model

    if args.prompt_tail < 0:
        raise QuickdraftError("--prompt-tail must be >= 0")
    data, output = Path(args.data).expanduser(), Path(args.output).expanduser()
    target = load_model(args.target, "bfloat16")
    files, docs = _documents(data, args.prompt_tail)
    kept = list(tqdm(docs, desc="reading", unit=" docs", disable=args.no_progress))
    if not kept:
        raise QuickdraftError(f"--data {data}: no train rows")
    tokens = concat_documents(kept)
    top = int(tokens.max())
    if top >= target.vocab_size:
        raise QuickdraftError(f"--data {data}: token id {top} is outside the target's vocabulary ({target.vocab_size})")
    meta = {
        "target": target.name,
        "vocab_size": int(target.vocab_size),
        "data": [str(f) for f in files],
        "documents": len(kept),
        "prompt_tail": args.prompt_tail,
        "built": datetime.date.today().isoformat(),
        "command": shlex.join(["quickdraft", *sys.argv[1:]]),
    }
    folder = save_datastore(tokens, output, meta)
    index = load_datastore(folder, target.vocab_size, quiet=args.no_progress)
    size = (folder / "tokens.npy.xz").stat().st_size
    print(
        f"datastore {folder}: {len(kept):,} documents, {len(index):,} tokens ({int(np.sum(tokens >= 0)):,} text), "
        f"{size / 1e6:.1f} MB compressed; use --drafter suffix:{folder}"
    )
    return 0
