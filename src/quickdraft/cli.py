"""Command-line entry point: `quickdraft generate | prepare | bench`.

argparse lives only here; each subcommand maps its flags to dataclasses and calls the library.
User errors exit with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from quickdraft.config import DTYPES, DraftConfig
from quickdraft.decoding.pearl import PearlConfig
from quickdraft.errors import QuickdraftError


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="local HF model folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="model dtype (default: bfloat16)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def _add_decode_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--method",
        default="sd",
        choices=("ar", "sd", "pearl"),
        help="ar = plain decoding, sd = speculative, pearl = PEARL (draft and target at the same time)",
    )
    p.add_argument("--gamma", default="auto", help="PEARL window: an integer or auto (measured; default)")
    p.add_argument("--parallel", action="store_true", help="PEARL in two worker processes (1 core each at least)")
    p.add_argument("--no-pre-verify", action="store_true", help="PEARL ablation: turn pre-verify off")
    p.add_argument("--no-post-verify", action="store_true", help="PEARL ablation: turn post-verify off")
    p.add_argument(
        "--drafter",
        default="ngram",
        help="ngram[:N] | model:PATH | truncated:LAYERS | distilled[:PATH] (default: ngram)",
    )
    p.add_argument("--draft-length", type=int, default=4, help="draft tokens per round, gamma (default: 4)")
    p.add_argument("--draft-schedule", default="fixed", choices=("fixed", "heuristic", "confidence"))
    p.add_argument("--confidence-threshold", type=float, default=0.4, help="for --draft-schedule confidence")
    p.add_argument(
        "--verifier",
        default=None,
        help="greedy | speculative (lossless; default by temperature) | lenient[:L] (LOSSY, temperature > 0)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quickdraft", description="Speculative decoding, lossless and measured.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one prompt and print statistics")
    gen.add_argument("prompt", help="the prompt (the chat template is applied unless --raw)")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--json", action="store_true", help='print {"text", "token_ids", "finish_reason", "stats"}')
    _add_model_flags(gen)
    _add_decode_flags(gen)
    gen.set_defaults(func=_cmd_generate)

    prep = sub.add_parser("prepare", help="convert the embedded default model once (GGUF -> safetensors cache)")
    prep.set_defaults(func=_cmd_prepare)

    from quickdraft.bench.cli import add_bench_parser

    add_bench_parser(sub, _add_model_flags)

    from quickdraft.distill.cli import add_distill_parsers

    add_distill_parsers(sub, _add_model_flags)

    # serve: unset flags stay absent so a YAML config can fill them (explicit flags win)
    srv = sub.add_parser(
        "serve", help="OpenAI-compatible server (127.0.0.1 by default)", argument_default=argparse.SUPPRESS
    )
    srv.add_argument("--config", help="YAML file with any of the settings below")
    srv.add_argument("--host", help="bind address (default 127.0.0.1)")
    srv.add_argument("--port", type=int, help="default 8000")
    srv.add_argument("--model-name", dest="model_name", help="the model id clients send (default: the target's name)")
    srv.add_argument(
        "--max-queue", dest="max_queue", type=int, help="requests allowed to wait (default 8); more get 429"
    )
    srv.add_argument("--default-max-tokens", dest="default_max_tokens", type=int, help="default 256")
    srv.add_argument(
        "--max-body-bytes", dest="max_body_bytes", type=int, help="larger request bodies get 413 (default 4 MiB)"
    )
    srv.add_argument("--target", help="local HF model folder (default: the embedded model)")
    srv.add_argument("--dtype", choices=DTYPES)
    srv.add_argument("--threads", type=int)
    srv.add_argument("--method", choices=("ar", "sd"))
    srv.add_argument("--drafter", help="ngram[:N] | model:PATH | truncated:LAYERS | distilled[:PATH]")
    srv.add_argument("--draft-length", dest="draft_length", type=int)
    srv.add_argument("--draft-schedule", dest="draft_schedule", choices=("fixed", "heuristic", "confidence"))
    srv.add_argument("--confidence-threshold", dest="confidence_threshold", type=float)
    srv.set_defaults(func=_cmd_serve)

    exp = sub.add_parser("export", help="write the equivalent config of another engine")
    exp.add_argument("--to", required=True, choices=("vllm",))
    exp.add_argument("--drafter", default="ngram", help="ngram[:N] | model:PATH | truncated:LAYERS | distilled[:PATH]")
    exp.add_argument("--draft-length", type=int, default=4)
    exp.add_argument("--target", default=None, help="local HF model folder (default: the embedded model)")
    exp.add_argument("--draft-out", default=None, help="where to save a truncated draft as an HF folder")
    exp.add_argument("--format", default="json", choices=("json", "yaml"))
    exp.add_argument("--output", default=None, help="file to write (default: stdout)")
    exp.set_defaults(func=_cmd_export)
    return parser


def _format_stats(stats: dict) -> str:
    per_pos = ", ".join(f"{r:.2f}" for r in stats["acceptance_rate_per_position"]) or "-"
    lines = [
        f"new tokens              {stats['num_new_tokens']}",
        f"target forwards         {stats['num_target_forwards']}",
        f"drafts / draft tokens   {stats['num_drafts']} / {stats['num_draft_tokens']}",
        f"accepted draft tokens   {stats['num_accepted_draft_tokens']}",
        f"draft_acceptance_rate   {stats['draft_acceptance_rate']:.3f}",
        f"mean_acceptance_length  {stats['mean_acceptance_length']:.3f}  (tokens per verification, bonus included)",
        f"acceptance by position  {per_pos}",
        f"tokens/s                {stats['tokens_per_s']:.2f}  (wall {stats['wall_s']:.2f} s: prefill "
        f"{stats['prefill_s']:.2f}, drafting {stats['draft_s']:.2f}, verifying {stats['verify_s']:.2f})",
    ]
    extra = stats.get("extra") or {}
    if extra.get("pearl_runs"):
        mat = extra["pearl_run_tokens"] / extra["pearl_runs"]
        lines.append(f"PEARL mean accepted     {mat:.3f}  (tokens per run of accepts up to a rejection)")
    if stats["lossy"]:
        lines.append(
            f"verification            LOSSY ({stats.get('verifier', 'lenient')}: "
            "output may differ from the target's distribution)"
        )
    return "\n".join(lines)


def _cmd_generate(args: argparse.Namespace) -> int:
    from quickdraft.config import SamplingConfig, StopConfig
    from quickdraft.engine import Engine, EngineConfig

    # validate every flag before the (slow) model load
    SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    StopConfig(max_new_tokens=args.max_new_tokens, stop_strings=tuple(args.stop))
    draft = DraftConfig(args.draft_length, args.draft_schedule, args.confidence_threshold)
    try:
        gamma = None if args.gamma == "auto" else int(args.gamma)
    except ValueError:
        raise QuickdraftError(f"--gamma must be an integer or auto, got {args.gamma!r}") from None
    pearl = PearlConfig(gamma, not args.no_pre_verify, not args.no_post_verify, args.parallel)
    config = EngineConfig(method=args.method, drafter=args.drafter, draft=draft, verifier=args.verifier, pearl=pearl)
    if args.verifier is not None:  # validate the name before the model load
        from quickdraft.verifiers import make_verifier

        make_verifier(args.verifier, SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p))
    engine = Engine.load(args.target, config, args.dtype, args.threads)
    try:
        result = engine.generate(
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop=args.stop,
            raw=args.raw,
        )
    finally:
        engine.close()
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print(result.text)
    label = "plain decoding" if args.method == "ar" else f"{args.method}, drafter {engine.drafter.name}"
    print(f"\n--- {engine.target_info.name} ({args.dtype}), {label}, finish_reason={result.finish_reason}")
    print(_format_stats(result.stats.to_dict()))
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from quickdraft.models.default import ensure_default_model

    print(ensure_default_model())
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from quickdraft.server import ServeConfig, engine_loader, load_config_file, serve

    known = {f.name for f in fields(ServeConfig)}  # flags map to settings by name; nothing else passes
    given = {k: v for k, v in vars(args).items() if k in known}
    settings = load_config_file(args.config) if getattr(args, "config", None) else {}
    cfg = ServeConfig(**{**settings, **given})
    engine_loader(cfg)  # validate method/drafter names before binding the port
    serve(cfg)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from quickdraft.drafters.spec import parse_drafter_spec
    from quickdraft.export import vllm_speculative_config
    from quickdraft.models.default import default_model_dir, ensure_default_model

    target_dir = args.target or str(default_model_dir())
    stages = parse_drafter_spec(args.drafter)
    if stages[0].kind == "truncated" and len(stages) == 1:
        from quickdraft.models.loading import load_model, truncated_copy

        if args.draft_out is None:
            raise QuickdraftError("a truncated draft must be saved for vLLM: add --draft-out DIR")
        target = load_model(args.target, "bfloat16")
        draft = truncated_copy(target, int(stages[0].arg))
        draft.model.save_pretrained(args.draft_out)
        if draft.tokenizer is not None:
            draft.tokenizer.save_pretrained(args.draft_out)
    elif args.target is None:
        ensure_default_model()
    config = vllm_speculative_config(args.drafter, args.draft_length, args.draft_out)
    if args.format == "yaml":
        import yaml

        text = yaml.safe_dump({"speculative_config": config}, sort_keys=False)
    else:
        text = json.dumps(config, indent=2) + "\n"
    if args.output:
        from pathlib import Path

        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    print(f"# vllm serve {target_dir} --speculative-config '{json.dumps(config)}'", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # recorded by commands that log themselves
    try:
        return args.func(args)
    except QuickdraftError as exc:
        print(f"quickdraft: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("quickdraft: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
