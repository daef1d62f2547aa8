"""A target's own generations for the SeqKD prompts, for a target with another tokenizer (Gemma 3
270M): its suffix datastore's corpus (`quickdraft build-datastore --data OUT --target NAME`).

    python scripts/target_corpus.py --target gemma3-270m --data ../shared/data/seqkd --output runs/gemma-corpus \
        --tokens 500000
    python scripts/target_corpus.py --target qwen2.5-coder-1.5b --chat --quantize w4a8 --output runs/qwen-corpus \
        --minutes 15 --threads 2

The SeqKD rows hold SmolLM2's chat-templated token ids: each prompt is decoded with SmolLM2's
tokenizer, its user turn taken out and re-encoded with the target's tokenizer, as raw text for a
base model (no chat template; `--chat` applies the target's own). Greedy continuations, a batch of
`--batch` prompts at a time through the engine's batch decoder (suffix speculation, lossless), are
written as gzip JSONL shards in the SeqKD row format (`id`, `split`, `mode`, `prompt_ids`,
`response_ids`, `finish`). The same command resumes: prompts already in a shard are skipped, and it
stops at `--tokens` response tokens or `--minutes`. Spec-Bench and HumanEval are never used.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from pathlib import Path

from quickdraft import Engine, EngineConfig
from quickdraft.training.seqkd import read_seqkd
from quickdraft.weights.loading import load_model

USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def user_turns(data: Path, max_chars: int) -> list[tuple[str, str, str]]:
    """(id, split, user text) of every distinct SeqKD prompt, shortest first."""
    from transformers import AutoTokenizer

    from quickdraft.weights.default import ensure_default_model

    smol = AutoTokenizer.from_pretrained(ensure_default_model())
    seen, out = set(), []
    for split in ("train", "heldout"):
        for row in read_seqkd(data, split):
            key = tuple(row.prompt)
            if key in seen:
                continue
            seen.add(key)
            match = USER.search(smol.decode(list(row.prompt)))
            if match and len(match.group(1)) <= max_chars:
                out.append((f"{split}-{len(out)}", split, match.group(1).strip()))
    return sorted(out, key=lambda r: len(r[2]))


def done(output: Path) -> tuple[set[str], int]:
    ids, tokens = set(), 0
    for shard in sorted(output.glob("seqkd-greedy-*.jsonl.gz")):
        with gzip.open(shard, "rt") as f:
            for line in f:
                row = json.loads(line)
                ids.add(row["id"])
                tokens += len(row["response_ids"])
    return ids, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="gemma3-270m")
    ap.add_argument("--data", type=Path, default=Path("../shared/data/seqkd"))
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=500_000, help="stop at this many response tokens")
    ap.add_argument("--minutes", type=float, default=0.0, help="stop after this many minutes (0: no limit)")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--max-chars", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--chat", action="store_true", help="apply the target's chat template (chat models)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quantize", default="none", help="the weights, as --quantize takes them (w4a8: GGUF blocks)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    args.output.mkdir(parents=True, exist_ok=True)
    target = load_model(args.target, "bfloat16")
    engine = Engine(target, EngineConfig(method="sd", drafter="suffix", quantize=args.quantize))
    have, tokens = done(args.output)
    prompts = []
    for pid, split, text in user_turns(args.data, args.max_chars):
        if pid in have:
            continue
        if args.chat:
            ids = target.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5 returns an encoding
        else:
            ids = target.tokenizer(text + "\n").input_ids
        if len(ids) <= args.max_prompt_tokens:
            prompts.append((pid, split, list(ids)))
    print(f"{len(have)} prompts done ({tokens} tokens), {len(prompts)} to go", file=sys.stderr)
    start, shard, before = time.time(), len(list(args.output.glob("seqkd-greedy-*.jsonl.gz"))), tokens
    eos = set(target.eos_token_ids)
    for at in range(0, len(prompts), args.batch):
        if tokens >= args.tokens or (args.minutes and time.time() - start > 60 * args.minutes):
            break
        part = prompts[at : at + args.batch]
        results = engine.generate([ids for _, _, ids in part], max_new_tokens=args.max_new_tokens)
        rows = []
        for (pid, split, ids), res in zip(part, results, strict=True):
            out = list(res.token_ids)
            rows.append({
                "id": pid, "split": split, "mode": "greedy", "prompt_ids": ids, "response_ids": out,
                "finish": "eos" if out and out[-1] in eos else "length",
            })  # fmt: skip
            tokens += len(out)
        with gzip.open(args.output / f"seqkd-greedy-{shard:05d}.jsonl.gz", "wt") as f:  # one shard per batch
            f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        shard += 1
        rate = (tokens - before) / max(1e-9, time.time() - start)
        print(f"{at + len(part)}/{len(prompts)} prompts, {tokens} tokens, {rate:.0f} tokens/s", file=sys.stderr)
    print(json.dumps({"target": target.name, "tokens": tokens, "shards": shard}))


if __name__ == "__main__":
    main()
