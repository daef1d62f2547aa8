"""`quickdraft bench` (run), `quickdraft bench compare`, `quality`, `plot` and `doc`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from quickdraft.settings.flags import add_option_flags

QUICK = {"limit": 1, "max_new_tokens": 64, "runs": 2}
DEFAULTS = {"limit": None, "max_new_tokens": 128, "runs": 3}


def add_bench_parser(sub, add_model_flags) -> None:
    bench = sub.add_parser("bench", help="benchmark methods against plain decoding (Spec-Bench style)")
    bench.add_argument(
        "--methods",
        default="ar,sd:drafter=ngram",
        help="comma-separated NAME[:key=value,...]; names: ar, sd, pearl (each also temperature=T: sampled, "
        "seeded), hf-ar, hf-assisted, llama-cpp (quantize=gguf|q4_0|q4_1|q8_0|bf16, lookup=N, or its own "
        "draft-model speculation: draft=NAME|FILE.gguf[,draft_max=N,draft_min=N,p_min=P])",
    )
    bench.add_argument("--prompts", default="spec_bench", help="spec_bench | humaneval | PATH.jsonl")
    bench.add_argument("--categories", default=None, help="comma-separated categories to keep")
    bench.add_argument("--limit", type=int, default=None, help="at most this many prompts per category")
    add_option_flags(bench, ("max_new_tokens",))  # absent: the preset's (128, or 64 with --quick)
    bench.add_argument("--runs", type=int, default=None, help="repeats (default 3)")
    bench.add_argument(
        "--quick", action="store_true", help="preset: 1 prompt per category, 64 new tokens, 2 runs (explicit flags win)"
    )
    bench.add_argument(
        "--batch",
        type=int,
        default=None,
        help="also run each run's prompts as one continuous batch of at most N rows (0: fitted to the host)",
    )
    bench.add_argument("--out", default="bench-out", help="output folder")
    add_model_flags(bench)
    bench.set_defaults(func=_cmd_bench)
    actions = bench.add_subparsers(dest="bench_action")

    cmp_ = actions.add_parser("compare", help="check a method's outputs against plain decoding")
    cmp_.add_argument("out", help="a benchmark output folder")
    cmp_.add_argument("--method", required=True, help="the method string as in results.json")
    cmp_.set_defaults(func=_cmd_compare)

    qual = actions.add_parser("quality", help="output quality of each method (lossy ones above all) vs plain decoding")
    qual.add_argument("out", help="a benchmark output folder")
    qual.set_defaults(func=_cmd_quality)

    plot = actions.add_parser("plot", help="draw a benchmark run's plots again from its results.json")
    plot.add_argument("out", help="a benchmark output folder")
    plot.set_defaults(func=_cmd_plot)

    doc = actions.add_parser("doc", help="write a markdown page from benchmark reports")
    doc.add_argument("outs", nargs="+", help="benchmark output folders")
    doc.add_argument(
        "--output",
        default="docs/benchmarks.md",
        help=f"the page: what it holds before {REPORTS!r} is kept, the reports after it are rewritten",
    )
    doc.set_defaults(func=_cmd_doc)


def _cmd_bench(args: argparse.Namespace) -> int:
    from quickdraft.bench.runner import BenchConfig, run_bench
    from quickdraft.settings.flags import given_options
    from quickdraft.settings.options import options_from

    model = options_from(given_options(args, ("target", "dtype", "threads", "runtime", "device", "quantize")))
    for key, value in QUICK.items():  # --quick fills what was not given; explicit flags win
        if getattr(args, key, None) is None:
            setattr(args, key, value if args.quick else DEFAULTS.get(key))
    config = BenchConfig(
        methods=args.methods,
        prompts=args.prompts,
        categories=args.categories.split(",") if args.categories else None,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        runs=args.runs,
        target=model.target,
        dtype=model.dtype,
        threads=model.threads,
        runtime=model.runtime,
        device=model.device,
        quantize=model.quantize,
        batch=args.batch,
        out=args.out,
        command="quickdraft " + shlex.join(sys.argv[1:]),
    )
    summary = run_bench(config)
    print((Path(args.out) / "report.md").read_text())
    print(f"results: {args.out}/results.json, rows: {args.out}/results.jsonl")
    return 0 if summary else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    from quickdraft.bench.compare import find_mismatches, load_rows
    from quickdraft.weights.loading import load_model

    rows, summary = load_rows(Path(args.out))
    cfg = summary["config"]
    target = load_model(cfg["target"], cfg["dtype"])
    tok = target.tokenizer
    total, mismatches = find_mismatches(rows, args.method, target.model, cfg["dtype"])
    show = (lambda t: repr(tok.decode([t]))) if tok is not None else str
    for m in mismatches:
        if m.ar_token < 0:
            print(f"{m.question_id} run {m.run}: one output is a prefix of the other at token {m.position}")
            continue
        verdict = "near-tie (numerics)" if m.near_tie else "REAL DIVERGENCE"
        print(
            f"{m.question_id} run {m.run}: first difference at token {m.position}: ar {show(m.ar_token)} vs "
            f"{show(m.method_token)}; top-2 margin {m.margin:.4g} ({cfg['dtype']}) -> {verdict}"
        )
    real = sum(not m.near_tie for m in mismatches)
    print(
        f"{args.method}: {total - len(mismatches)}/{total} outputs identical to plain decoding; "
        f"{len(mismatches) - real} near-tie divergences, {real} unexplained"
    )
    return 1 if real else 0


def _cmd_plot(args: argparse.Namespace) -> int:
    import json

    from quickdraft.bench.report import write_plots
    from quickdraft.errors import QuickdraftError

    path = Path(args.out) / "results.json"
    if not path.is_file():
        raise QuickdraftError(f"{args.out} holds no results.json (a `quickdraft bench --out` folder)")
    for name in write_plots(Path(args.out), json.loads(path.read_text())):
        print(f"written: {args.out}/{name}")
    return 0


def _cmd_quality(args: argparse.Namespace) -> int:
    from quickdraft.bench.quality import quality, render
    from quickdraft.prompts import PromptCodec
    from quickdraft.weights.loading import load_model

    cfg = json.loads((Path(args.out) / "results.json").read_text())["config"]
    codec = PromptCodec.for_target(load_model(cfg["target"], cfg["dtype"]))
    print(render(quality(Path(args.out), codec.decode)))
    print(f"written: {args.out}/quality.json")
    return 0


REPORTS = "# Reports written by the harness"  # where a page's hand-written part ends


def _cmd_doc(args: argparse.Namespace) -> int:
    """Rewrite the reports section of the page `--output` from the runs' report.md files; the text
    above it (the summaries people write) is kept as it is, so the page is written in one place."""
    from quickdraft.errors import QuickdraftError

    page = Path(args.output)
    kept = page.read_text().split(REPORTS, 1)[0].rstrip("\n") + "\n\n" if page.is_file() else ""
    parts = [kept + REPORTS + "\n"]
    for out in args.outs:
        report = Path(out) / "report.md"
        if not report.is_file():
            raise QuickdraftError(f"{out} has no report.md")
        text = report.read_text()
        # plots live beside the report: point image links at them, relative to the output page
        rel = os.path.relpath(Path(out).resolve(), Path(args.output).resolve().parent)
        text = text.replace("](", f"]({rel}/")
        parts.append(text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text("\n".join(parts))
    print(f"wrote {args.output}")
    return 0
