"""`quickdraft train-draft`: train Kangaroo adapters and feature heads on the SeqKD corpus.

    quickdraft train-draft --kind head,kangaroo --data ../shared/data/seqkd --output runs/heads

Running the same command again resumes from `OUTPUT/checkpoint.pt`. Each trained module is written
to `OUTPUT/KIND/` (weights, restricted head ids, a JSON with its provenance and held-out figures
before and after) and is used with `--drafter KIND:OUTPUT/KIND`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from quickdraft.drafters.kinds import KINDS as DRAFTER_KINDS
from quickdraft.errors import QuickdraftError
from quickdraft.models.head_files import HEAD_META, save_draft_head
from quickdraft.runtime.choose import resolve_device
from quickdraft.settings.flags import add_option_flags
from quickdraft.training.decode_eval import gain_meta, tree_gain
from quickdraft.training.seqkd import read_seqkd, shuffled
from quickdraft.training.student import rank_tokens
from quickdraft.training.train_heads import HeadTrainingConfig

KINDS = tuple(k.name for k in DRAFTER_KINDS.values() if k.trained_by == "train-draft")  # from the kind records


def add_train_draft_parser(sub) -> None:
    t = sub.add_parser(
        "train-draft", help="train Kangaroo adapters, feature heads and SpecDec block drafters on a SeqKD corpus"
    )
    t.add_argument(
        "--kind",
        default="head",
        help=f"{' | '.join(KINDS)}, or several joined by ',' (one target pass trains all)",
    )
    t.add_argument("--data", required=True, help="SeqKD corpus folder (seqkd-*.jsonl.gz)")
    t.add_argument("--output", required=True, help="run folder; the same command again resumes")
    add_option_flags(t, ("target", "quantize"), keep_defaults=True)
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="stop after this many minutes of training (0: run --steps); the learning-rate schedule spans the budget",
    )
    t.add_argument("--batch-size", type=int, default=8, help="corpus rows per step")
    t.add_argument("--max-len", type=int, default=256, help="tokens per row window (prompt tail + response)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=40)
    t.add_argument("--exit-layer", type=int, default=2, help="Kangaroo's early-exit layer l")
    t.add_argument("--block", type=int, default=4, help="SpecDec: tokens the block drafter drafts per forward")
    t.add_argument("--head-vocab", type=int, default=8192, help="restricted LM head: the K most frequent ids (0: all)")
    t.add_argument("--feature-weight", type=float, default=1.0, help="weight of the head's feature regression")
    t.add_argument(
        "--ttt-steps",
        type=int,
        default=1,
        help="head: unroll n steps on its own predicted features (EAGLE-3's training-time test), 1..8",
    )
    t.add_argument(
        "--init",
        action="append",
        default=[],
        metavar="DIR",
        help="start a module from a trained one (its folder, e.g. a shipped head; repeatable); its head ids are kept",
    )
    t.add_argument(
        "--store", default=None, help="feature store folder (default OUTPUT/store): the target's states, computed once"
    )
    t.add_argument("--eval-rows", type=int, default=48, help="held-out rows scored (half greedy, half sampled)")
    t.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps into eval.jsonl (0: start, end)")
    t.add_argument("--decode-prompts", type=int, default=8, help="held-out prompts decoded at each evaluation")
    t.add_argument("--checkpoint-every", type=int, default=50)
    t.add_argument("--seed", type=int, default=0)
    add_option_flags(t, ("threads", "device"), keep_defaults=True)
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=cmd_train_draft)

    b = sub.add_parser("build-bigram", help="CS Drafting's MaG bigram table from a SeqKD corpus (train rows)")
    b.add_argument("--data", required=True, help="SeqKD corpus folder (seqkd-*.jsonl.gz)")
    b.add_argument("--output", required=True, help="folder for bigram.safetensors (use with --drafter mag:FOLDER)")
    add_option_flags(b, ("target",), keep_defaults=True)
    b.set_defaults(func=cmd_build_bigram)


def cmd_build_bigram(args: argparse.Namespace) -> int:
    """Most frequent successor of every token over the corpus's prompts and responses (train split)."""
    from quickdraft.drafters.model_free.mag import build_bigram, save_bigram
    from quickdraft.weights.loading import load_model

    target = load_model(args.target, "bfloat16")
    rows = read_seqkd(Path(args.data), "train")
    table = build_bigram((list(r.prompt) + list(r.response) for r in rows), target.vocab_size)
    meta = {
        "target": target.name,
        "data": str(args.data),
        "train_rows": str(len(rows)),
        "command": shlex.join(sys.argv),
    }
    path = save_bigram(table, Path(args.output), meta)
    print(f"bigram table: {int((table >= 0).sum())} of {table.numel()} tokens have a successor; saved {path}")
    return 0


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        others = {k: DRAFTER_KINDS[k].trained_by for k in bad if k in DRAFTER_KINDS and DRAFTER_KINDS[k].trained_by}
        hint = "".join(f" (the {k} drafter is made by `quickdraft {cmd}`)" for k, cmd in others.items())
        raise QuickdraftError(f"--kind: unknown {', '.join(bad) or 'empty'}; choose from {', '.join(KINDS)}{hint}")
    return tuple(dict.fromkeys(kinds))


def export(folder: Path, module, head_ids: torch.Tensor | None, meta: dict) -> Path:
    """Write a trained module, its restricted head ids and its provenance (`models/head_files.py`)."""
    return save_draft_head(folder, module, head_ids, meta)


def cmd_train_draft(args: argparse.Namespace) -> int:
    from quickdraft.runtime.forward.native import NativeLlama
    from quickdraft.runtime.quant.modes import parse_quantize
    from quickdraft.runtime.quant.quantized import quantize_model
    from quickdraft.settings.defaults import AUTO, auto_weights
    from quickdraft.training.train_run import TrainRun, summary
    from quickdraft.weights.loading import load_model

    kinds = _kinds(args.kind)
    device = resolve_device(args.device)
    if args.threads is not None:
        if args.threads < 1:
            raise QuickdraftError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if not 1 <= args.ttt_steps <= 8:
        raise QuickdraftError(f"--ttt-steps must be in 1..8, got {args.ttt_steps}")
    if args.minutes < 0:
        raise QuickdraftError(f"--minutes must be >= 0, got {args.minutes}")
    if args.eval_every < 0:
        raise QuickdraftError(f"--eval-every must be >= 0, got {args.eval_every}")
    cfg = HeadTrainingConfig(
        kinds=kinds, steps=args.steps, batch_size=args.batch_size, max_len=args.max_len, lr=args.lr,
        warmup=args.warmup, exit_layer=args.exit_layer, block=args.block, head_vocab=args.head_vocab,
        feature_weight=args.feature_weight, checkpoint_every=args.checkpoint_every, seed=args.seed,
        ttt_steps=args.ttt_steps, minutes=args.minutes,
    )  # fmt: skip
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    target = load_model(args.target, "bfloat16")
    target.model.to(device)
    # the target's states as it runs at inference: under --quantize w4a8 its blocks make the features the
    # drafter will read (and a 1.5B's store fills faster than in bf16)
    mode = args.quantize or AUTO  # auto: as inference resolves it (a GGUF-born target: its own blocks)
    weights = parse_quantize(auto_weights(target, "bfloat16", "native", device).value if mode == AUTO else mode)
    held = quantize_model(target, weights) if weights.active else None  # held: decode_eval's engines share it
    net = NativeLlama(target.model, held.linears if held is not None else None)
    train = read_seqkd(Path(args.data), "train")
    held_all = shuffled(read_seqkd(Path(args.data), "heldout"), args.seed)
    half = (args.eval_rows + 1) // 2  # as many sampled rows as greedy ones: greedy loops flatter a draft
    held = [r for r in held_all if r.mode == "greedy"][:half] + [r for r in held_all if r.mode == "sample"][:half]
    inits = [_read_init(Path(folder), target, kinds) for folder in args.init]
    head_ids = _head_ids(train, target, args.head_vocab) if not inits else inits[0][2]
    if any(not _same(i[2], head_ids) for i in inits):
        raise QuickdraftError("--init: the modules restrict the LM head to different ids; start them in separate runs")
    ids = head_ids.to(device) if head_ids is not None else torch.arange(target.output_vocab_size, device=device)
    store = Path(args.store) if args.store else out / "store"
    run = TrainRun(cfg, out, store, net, target, train, held, ids, device, args.decode_prompts, str(weights))
    ckpt_path, report_path = out / "checkpoint.pt", out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    if run.resume(ckpt_path):
        print(f"resuming {out} at step {run.step}/{cfg.steps}", file=sys.stderr)
    else:
        for kind, module, _ in inits:
            run.modules[kind].load_state_dict({n: v.float() for n, v in module.state_dict().items()})
    if "before" not in report or set(report.get("started_at", {})) != set(kinds):
        first = run.evaluate()
        report.setdefault("before", {})
        report.setdefault("started_at", {})
        for k in kinds:
            report["before"].setdefault(k, first[k])
            report["started_at"].setdefault(k, run.step)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    started = time.perf_counter()
    run.run(args.eval_every, ckpt_path, not args.no_progress)
    after = run.evaluate()
    for k in kinds:  # written before the gain table (minutes more), so a run stopped there keeps them
        export(out / k, run.modules[k], head_ids, {"target": target.name, "heldout_after": after[k], "partial": True})
    gains = {  # a tree drafter's (the head's) tokens per forward by tree budget: what sizes `draft_tree` auto
        k: tree_gain(run.modules[k], target, run.ids_or_none, run.prompts, quantize=str(weights))
        for k in kinds
        if DRAFTER_KINDS[k].drafts_trees and run.prompts
    }
    seconds = time.perf_counter() - started
    sessions = report.get("sessions", []) + [
        {"steps_to": run.step, "seconds": round(seconds, 1), "device": device, "throughput": run.speed.report()}
    ]
    for k in kinds:
        meta = {
            "target": target.name,
            "data": str(args.data),
            "train_rows": len(train),
            "steps": run.step - report["started_at"].get(k, 0),
            "rows_seen": (run.step - report["started_at"].get(k, 0)) * cfg.batch_size,
            "positions_seen": run.positions,
            "init": [str(Path(f).resolve()) for f in args.init],
            "heldout_rows": {mode: sum(len(b.lengths) for b in bs) for mode, bs in run.evals.items()},
            "heldout_before": report["before"][k],
            "heldout_after": after[k],
            "train_config": {n: v for n, v in asdict(cfg).items() if n != "extra"},
            "device": device,
            "sessions": sessions,
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "quickdraft " + shlex.join(sys.argv[1:]),
            **(gain_meta(gains[k], len(run.prompts)) if k in gains else {}),
        }  # fmt: skip
        export(out / k, run.modules[k], head_ids, meta)
    report.update({"after": after, "history": run.history, "sessions": sessions})
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    for k in kinds:
        print(f"{k}: held-out {summary(after[k])} (before: {summary(report['before'][k])}); saved {out / k}")
    print(f"throughput: {run.speed.report()}; evaluations: {out / 'eval.jsonl'}, {out / 'eval.png'}")
    return 0


def _read_init(folder: Path, target, kinds: tuple[str, ...]):
    """(kind, module, head ids) of a trained module's folder, for `--init`."""
    from quickdraft.models.head_files import load_draft_head

    meta = folder / HEAD_META
    kind = json.loads(meta.read_text())["config"]["kind"] if meta.is_file() else None
    if kind is None:
        raise QuickdraftError(f"--init {folder}: no trained draft module there ({HEAD_META})")
    if kind not in kinds:
        raise QuickdraftError(f"--init {folder}: a {kind} module, but --kind is {','.join(kinds)}")
    module, head_ids, _ = load_draft_head(folder, DRAFTER_KINDS[kind].module, target.model, torch.float32)
    return kind, module, head_ids


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _head_ids(train, target, head_vocab: int) -> torch.Tensor | None:
    """The restricted LM head's ids: the K most frequent response ids (EOS always), topped up with
    unseen ids, lowest first; None for the full vocabulary."""
    if not head_vocab:
        return None
    vocab = target.output_vocab_size
    eos = [int(t) for t in target.eos_token_ids if t < vocab]
    head_ids = rank_tokens((r.response for r in train), always=eos)[:head_vocab]
    if head_ids.numel() < head_vocab:
        seen = set(head_ids.tolist())
        rest = [i for i in range(vocab) if i not in seen][: head_vocab - head_ids.numel()]
        head_ids = torch.cat([head_ids, torch.tensor(rest, dtype=torch.long)])
    return head_ids
