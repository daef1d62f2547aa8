"""Measure a trained feature head's gain table (tokens per target forward by tree budget) and write it
into its folder's json, where `--draft-tree auto` reads it: the budget is then sized on each host
from its verify-cost curve and the head's own measured step cost (decoding/registry.py).

`quickdraft train-draft` writes the table when it exports a head; this script does the same for a
folder exported before that (or re-measures one), on the same held-out corpus prompts that
train-draft's decode evaluation uses (the corpus's held-out split, greedy rows, shuffled with seed 0).

    python scripts/head_tree_gain.py src/quickdraft/assets/head/smollm2-135m-instruct --data ../shared/data/seqkd
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from quickdraft.drafters.kinds import KINDS
from quickdraft.models.head_files import HEAD_META, load_draft_head
from quickdraft.training.decode_eval import gain_meta, tree_gain
from quickdraft.training.seqkd import read_seqkd, shuffled
from quickdraft.weights.loading import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="a trained head's folder (draft_head.json, weights, head ids)")
    ap.add_argument("--data", required=True, help="SeqKD corpus folder: its held-out greedy prompts")
    ap.add_argument("--target", default=None, help="target model (default: the embedded default)")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts decoded per budget")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true", help="print the table, do not write it")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(args.folder)
    target = load_model(args.target, "bfloat16")
    module, head_ids, meta = load_draft_head(folder, KINDS["head"].module, target.model, torch.float32)
    held = shuffled(read_seqkd(Path(args.data), "heldout"), 0)
    prompts = [list(r.prompt) for r in held if r.mode == "greedy"][: args.prompts]
    gain = tree_gain(module, target, head_ids, prompts)
    print(json.dumps(gain))
    if not args.dry_run:
        meta.update(gain_meta(gain, len(prompts), command="python " + shlex.join(sys.argv)))
        (folder / HEAD_META).write_text(json.dumps(meta, indent=2) + "\n")
        print(f"wrote tree_gain into {folder / HEAD_META}")


if __name__ == "__main__":
    main()
