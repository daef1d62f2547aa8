"""Rank a target's token ids by frequency in the SeqKD text, for self-drafts with a restricted head
(`truncated:N;vocab=K`, `quant:MODE;vocab=K`; drafters/draft_models/vocab.py).

    python scripts/rank_vocab.py --target gemma3-270m --data ../shared/data/seqkd \
        --output src/quickdraft/assets/vocab/gemma-3-270m

The SeqKD rows hold SmolLM2's token ids (ShareGPT prompts and SmolLM2's answers, the train split
only; Spec-Bench and HumanEval are never read): they are decoded with SmolLM2's tokenizer and
re-encoded with the target's, and the ids are counted. The `--keep` most frequent (ids never seen are
left out) are written, most frequent first, as `ranked_ids.safetensors` (int32 "ranked").
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from quickdraft.drafters.draft_models.vocab import RANKED
from quickdraft.weights.default import ensure_default_model
from quickdraft.weights.loading import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="a named target or a model folder (default: the embedded one)")
    ap.add_argument("--data", type=Path, default=Path("../shared/data/seqkd"))
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--keep", type=int, default=65536)
    args = ap.parse_args()
    smol = AutoTokenizer.from_pretrained(ensure_default_model())
    target = load_model(args.target, "bfloat16")
    counts: collections.Counter = collections.Counter()
    shards = sorted(args.data.glob("seqkd-*.jsonl.gz"))
    if not shards:
        print(f"rank_vocab: no seqkd-*.jsonl.gz shards in {args.data}", file=sys.stderr)
        return 2
    for shard in shards:
        with gzip.open(shard, "rt") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        ids = [r["prompt_ids"] + r["response_ids"] for r in rows if r["split"] == "train"]
        texts = smol.batch_decode(ids, skip_special_tokens=True)
        for encoded in target.tokenizer(texts, add_special_tokens=False)["input_ids"]:
            counts.update(encoded)
        print(f"{shard.name}: {sum(counts.values())} tokens, {len(counts)} distinct ids", file=sys.stderr)
    ranked = torch.tensor([t for t, _ in counts.most_common(args.keep)], dtype=torch.int32)
    args.output.mkdir(parents=True, exist_ok=True)
    meta = {"target": target.name, "source": "seqkd train split, re-encoded", "tokens": str(sum(counts.values()))}
    save_file({"ranked": ranked}, str(args.output / RANKED), metadata=meta)
    print(f"written: {args.output / RANKED} ({ranked.numel()} ids of {len(counts)} seen)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
