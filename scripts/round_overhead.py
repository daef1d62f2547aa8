"""The decode loop's own cost per round: a tiny random Llama (2 layers, 32 wide, ~0.2 ms a forward),
so what is timed is mostly the loop around the forward (drafting, verifying, committing).

A lone request and a batch of 4 rows. Run it on two trees one after the other to compare their
loops (best of `--repeats` generations, per target forward):

    PYTHONPATH=<old tree>/src .venv/bin/python scripts/round_overhead.py
    .venv/bin/python scripts/round_overhead.py
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from quickdraft import Engine
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.settings.options import options_from
from quickdraft.weights.loading import LoadedModel

SPECS = {
    "ngram chain": {"drafter": "ngram", "draft_tree": 0, "guard": False},
    "suffix tree 8": {"drafter": "suffix:none", "draft_tree": 8, "guard": False},
}


def tiny_llama() -> LoadedModel:
    """A random Llama with peaky logits, so greedy text repeats and drafts are accepted."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    return LoadedModel(model=LlamaForCausalLM(config).eval(), tokenizer=None, name="tiny")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = tiny_llama()
    prompt = [5, 9, 13, 2] * 9
    for label, spec in SPECS.items():
        engine = Engine(loaded, options_from(spec))
        best, forwards = float("inf"), 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = engine.generate_ids(prompt, SamplingConfig(), StopConfig(args.tokens))
            forwards = out.stats.num_target_forwards
            best = min(best, (time.perf_counter() - start) / forwards)
        print(f"{label}: {best * 1e3:.3f} ms per round ({forwards} target forwards)")
        prompts = [prompt, prompt[1:], prompt[2:], prompt[3:]]
        best, rounds = float("inf"), 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            outs = engine.generate_batch(prompts, SamplingConfig(), StopConfig(args.tokens), max_batch=4)
            rounds = max(out.stats.num_target_forwards for out in outs)
            best = min(best, (time.perf_counter() - start) / rounds)
        print(f"{label}, a batch of 4: {best * 1e3:.3f} ms per round ({rounds} rounds)")


if __name__ == "__main__":
    main()
