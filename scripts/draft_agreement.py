"""Teacher-forced agreement of draft models with a target's own greedy outputs, on a corpus's held-out rows.

    python scripts/draft_agreement.py --target qwen2.5-coder-1.5b --data runs/qwen-corpus \
        --draft "model:qwen2.5-coder-0.5b;vocab=32768" --draft distilled:runs/qwen-distill/delta

For every held-out greedy row (`scripts/target_corpus.py`'s shards: the target's greedy answers), each
draft reads the prompt and the target's response and predicts every response token; the share it
predicts exactly (its argmax over its own head: a `;vocab=K` or a delta's restricted ids) is what a
greedy verify accepts of a one-token draft. Drafts run in bf16 through transformers (the quantized
forms the bench runs agree with these to within a point). Spec-Bench and HumanEval are never used.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from quickdraft.drafters.draft_models.model_drafter import UNSET, parse_model
from quickdraft.drafters.draft_models.vocab import restricted_head
from quickdraft.training.data import _response_scored, collate
from quickdraft.training.scoring import scored_logits
from quickdraft.training.seqkd import read_seqkd
from quickdraft.weights.delta import load_delta
from quickdraft.weights.loading import LoadedModel, load_model


def draft_of(spec: str, target: LoadedModel) -> LoadedModel:
    """A `model:NAME[;vocab=K]` or `distilled:PATH` draft, loaded in bf16 with its head ids."""
    if spec.startswith("distilled:"):
        return load_delta(target, Path(spec.removeprefix("distilled:")), torch.bfloat16)
    path, form = parse_model(spec.removeprefix("model:"))
    draft = load_model(path, "bfloat16")
    draft.head_ids = restricted_head(target, None if form.vocab == UNSET else form.vocab)
    return draft


@torch.inference_mode()
def agreement(draft: LoadedModel, rows) -> tuple[int, int]:
    """(tokens predicted exactly, tokens) over the rows' responses: the draft's scored logits at
    each response position (training's `scored_logits`, over its head ids where it has them)."""
    hits = total = 0
    ids = None if draft.head_ids is None else draft.head_ids.long()
    for row in rows:
        scored = _response_scored(len(row.prompt), len(row.response))
        batch = collate([list(row.prompt) + list(row.response)], [scored], 0, "greedy")
        best = scored_logits(draft.model, batch, ids).argmax(-1)  # (N,)
        pred = best if ids is None else ids[best]
        hits += int((pred == torch.tensor(row.response)).sum())
        total += len(row.response)
    return hits, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--data", required=True, help="a corpus of the target's greedy outputs")
    parser.add_argument("--draft", action="append", required=True, help="model:NAME[;vocab=K] or distilled:PATH")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.target, "bfloat16")  # its tokenizer and vocabulary: its weights never run
    rows = read_seqkd(Path(args.data), "heldout", ("greedy",))
    for spec in args.draft:
        hits, total = agreement(draft_of(spec, target), rows)
        print(f"{spec}: {hits}/{total} = {hits / total:.4f} over {len(rows)} held-out rows")


if __name__ == "__main__":
    main()
