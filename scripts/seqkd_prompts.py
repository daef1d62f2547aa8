"""Write the SeqKD corpus's held-out prompts as a Spec-Bench-style JSONL (for `quickdraft bench --prompts`).

    python scripts/seqkd_prompts.py ../shared/data/seqkd runs/seqkd-heldout.jsonl --limit 13 --mode sample

The prompts are decoded from the rows' chat-templated `prompt_ids` (the user turn between the
template's user and assistant markers); the bench applies the same template again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quickdraft.training.seqkd import read_seqkd, shuffled
from quickdraft.weights.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--limit", type=int, default=13)
    parser.add_argument("--mode", default="sample", choices=("greedy", "sample"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = load_model(None, "bfloat16").tokenizer
    rows = shuffled(read_seqkd(Path(args.data), "heldout", modes=(args.mode,)), args.seed)
    written = 0
    with open(args.out, "w") as f:
        for row in rows:
            text = tokenizer.decode(list(row.prompt))
            user = text.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0].strip()
            if not user or len(user) > 1500:
                continue
            f.write(
                json.dumps({"question_id": written, "category": f"seqkd-heldout-{args.mode}", "turns": [user]}) + "\n"
            )
            written += 1
            if written == args.limit:
                break
    print(f"wrote {written} held-out prompts to {args.out}")


if __name__ == "__main__":
    main()
