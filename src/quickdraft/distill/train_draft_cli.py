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
from safetensors.torch import save_file

from quickdraft.distill.seqkd import read_seqkd, shuffled
from quickdraft.distill.student import rank_tokens
from quickdraft.distill.train_heads import (
    HeadTrainingConfig,
    batch_rows,
    decode_eval,
    evaluate,
    lr_at,
    new_module,
    save_checkpoint,
    target_batch,
    train_loss,
)
from quickdraft.drafters.kinds import KINDS as DRAFTER_KINDS
from quickdraft.errors import QuickdraftError
from quickdraft.flags import add_option_flags
from quickdraft.models.draft_heads import HEAD_IDS, HEAD_META, HEAD_WEIGHTS, config_dict

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
    add_option_flags(t, ("target",), keep_defaults=True)
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--batch-size", type=int, default=8, help="corpus rows per step")
    t.add_argument("--max-len", type=int, default=256, help="tokens per row window (prompt tail + response)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=40)
    t.add_argument("--exit-layer", type=int, default=2, help="Kangaroo's early-exit layer l")
    t.add_argument("--block", type=int, default=4, help="SpecDec: tokens the block drafter drafts per forward")
    t.add_argument("--head-vocab", type=int, default=8192, help="restricted LM head: the K most frequent ids (0: all)")
    t.add_argument("--feature-weight", type=float, default=1.0, help="weight of the head's feature regression")
    t.add_argument("--eval-rows", type=int, default=48, help="held-out rows scored before and after")
    t.add_argument("--decode-prompts", type=int, default=8, help="held-out prompts decoded after training")
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
    from quickdraft.drafters.mag import build_bigram, save_bigram
    from quickdraft.models.loading import load_model

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


def _train_device(name: str) -> str:
    """Training runs where asked: cpu, or cuda when a CUDA device exists (auto picks it)."""
    if name not in ("auto", "cpu", "cuda"):
        raise QuickdraftError(f"unknown device {name!r}; choose one of auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise QuickdraftError(f"--device cuda: no CUDA device is available (torch {torch.__version__})")
    return "cuda" if name != "cpu" and torch.cuda.is_available() else "cpu"


def export(folder: Path, module, head_ids: torch.Tensor | None, meta: dict) -> Path:
    """Write a trained module (bfloat16), its restricted head ids and its provenance."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(folder / HEAD_WEIGHTS))
    if head_ids is not None:
        save_file({"head_ids": head_ids.to(torch.int64).contiguous()}, str(folder / HEAD_IDS))
    (folder / HEAD_META).write_text(json.dumps({"config": config_dict(module.cfg), **meta}, indent=2) + "\n")
    return folder


def cmd_train_draft(args: argparse.Namespace) -> int:
    from quickdraft.models.loading import load_model
    from quickdraft.models.native import NativeLlama

    kinds = _kinds(args.kind)
    device = _train_device(args.device)
    if args.threads is not None:
        if args.threads < 1:
            raise QuickdraftError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    cfg = HeadTrainingConfig(
        kinds=kinds, steps=args.steps, batch_size=args.batch_size, max_len=args.max_len, lr=args.lr,
        warmup=args.warmup, exit_layer=args.exit_layer, block=args.block, head_vocab=args.head_vocab,
        feature_weight=args.feature_weight, checkpoint_every=args.checkpoint_every, seed=args.seed,
    )  # fmt: skip
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    target = load_model(args.target, "bfloat16")
    target.model.to(device)
    net = NativeLlama(target.model)
    train = read_seqkd(Path(args.data), "train")
    held = shuffled(read_seqkd(Path(args.data), "heldout"), args.seed)[: args.eval_rows]
    vocab = target.output_vocab_size
    eos = [int(t) for t in target.eos_token_ids if t < vocab]
    head_ids = rank_tokens((r.response for r in train), always=eos)[: args.head_vocab] if args.head_vocab else None
    if head_ids is not None and head_ids.numel() < args.head_vocab:  # fill with unseen ids, lowest first
        seen = set(head_ids.tolist())
        rest = [i for i in range(vocab) if i not in seen][: args.head_vocab - head_ids.numel()]
        head_ids = torch.cat([head_ids, torch.tensor(rest, dtype=torch.long)])
    ids = head_ids.to(device) if head_ids is not None else torch.arange(vocab, device=device)
    embed, full_head = net.embed.detach(), net.head[:vocab].detach()  # frozen
    sub_head = full_head[ids]
    layer = cfg.exit_layer if "kangaroo" in kinds else None
    evals = [
        target_batch(net, held[i : i + cfg.batch_size], cfg.max_len, layer) for i in range(0, len(held), cfg.batch_size)
    ]
    modules = {k: new_module(k, target.model, cfg).to(device) for k in kinds}
    optims = {
        k: torch.optim.AdamW(m.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0) for k, m in modules.items()
    }
    ckpt_path, step, history = out / "checkpoint.pt", 0, []
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    if ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location=device)
        if not set(state["modules"]) <= set(kinds):
            raise QuickdraftError(
                f"{ckpt_path} trains {sorted(state['modules'])}, not {list(kinds)}: use another --output"
            )
        for k in state["modules"]:  # a kind added on resume starts fresh, trained from this step on
            modules[k].load_state_dict(state["modules"][k])
            optims[k].load_state_dict(state["optims"][k])
        step, history = int(state["step"]), state["history"]
        print(f"resuming {out} at step {step}/{cfg.steps}", file=sys.stderr)
    report.setdefault("before", {})
    report.setdefault("started_at", {})
    for k in kinds:
        if k not in report["before"]:
            report["before"][k] = evaluate(modules[k], k, evals, embed, full_head, ids)
            report["started_at"][k] = step
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=step, disable=args.no_progress, desc="train-draft", unit="step")
    started, tokens = time.perf_counter(), 0
    while step < cfg.steps:
        batch = target_batch(net, batch_rows(train, step, cfg.batch_size, cfg.seed), cfg.max_len, layer)
        tokens += sum(batch.lengths)
        row = {"step": step + 1}
        for k in kinds:
            for group in optims[k].param_groups:
                group["lr"] = lr_at(step, cfg)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss, stats = train_loss(modules[k], k, batch, embed, sub_head, cfg.feature_weight)
            optims[k].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(modules[k].parameters(), 1.0)
            optims[k].step()
            row.update({f"{k}_{name}": round(v, 4) for name, v in stats.items()})
        history.append(row)
        step += 1
        bar.update(1)
        bar.set_postfix({n: v for n, v in row.items() if n.endswith("agree")})
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_checkpoint(ckpt_path, step, modules, optims, history)
    bar.close()
    after = {k: evaluate(modules[k], k, evals, embed, full_head, ids) for k in kinds}
    prompts = [list(r.prompt) for r in held[: args.decode_prompts]]
    for k in kinds:  # tokens per target forward, decoding held-out prompts with the trained module
        after[k]["decode"] = decode_eval(modules[k], k, target, head_ids, prompts)
    seconds = time.perf_counter() - started
    for k in kinds:
        meta = {
            "target": target.name,
            "data": str(args.data),
            "train_rows": len(train),
            "steps": cfg.steps - report["started_at"].get(k, 0),
            "rows_seen": (cfg.steps - report["started_at"].get(k, 0)) * cfg.batch_size,
            "heldout_rows": len(held),
            "heldout_before": report["before"][k],
            "heldout_after": after[k],
            "train_config": {n: v for n, v in asdict(cfg).items() if n != "extra"},
            "device": device,
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "quickdraft " + shlex.join(sys.argv[1:]),
        }
        export(out / k, modules[k], head_ids, meta)
    report.update({"after": after, "history": history, "last_session_seconds": round(seconds, 1)})
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    for k in kinds:
        b, a = report["before"][k], after[k]
        print(
            f"{k}: held-out greedy agreement {b['greedy_agreement']:.3f} -> {a['greedy_agreement']:.3f}, "
            f"expected acceptance (T=1) {b['expected_acceptance_t1']:.3f} -> {a['expected_acceptance_t1']:.3f}; "
            f"tokens per target forward {a['decode']['tokens_per_target_forward']:.2f}; "
            f"saved {out / k}"
        )
    return 0
