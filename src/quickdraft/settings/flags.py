"""CLI flags made from the options table (`options.OPTIONS`): every command's flags for engine,
request and model options have the table's names, types, choices, defaults and help."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from quickdraft.settings.options import OPTIONS, int_or_auto


def add_option_flags(parser: argparse.ArgumentParser, names: Iterable[str], keep_defaults: bool = False) -> None:
    """CLI flags for `names`; an absent flag stays absent from the namespace (defaults live in the
    dataclasses, so a YAML file or a later layer can fill it), or, with `keep_defaults`, takes the
    table's default (commands that read `args.NAME` directly: distill, train-draft, export)."""

    def keep_default(value):
        return list(value) if isinstance(value, tuple) else value

    for name in names:
        opt = OPTIONS[name]
        default = opt.default
        if opt.flag is not None:  # a boolean switch that flips the default
            parser.add_argument(
                opt.flag, dest=name, action="store_const", const=not default, default=argparse.SUPPRESS, help=opt.help
            )
            continue
        kind = opt.parse if opt.parse in (int, float) else str
        shown = "auto" if default is None and opt.parse is int_or_auto else default
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            choices=opt.choices,
            action="append" if opt.many else "store",
            default=keep_default(default) if keep_defaults else argparse.SUPPRESS,
            help=opt.help if opt.many else f"{opt.help} (default: {shown})",
        )


def given_options(args: argparse.Namespace, names: Iterable[str] | None = None) -> dict[str, object]:
    """The option flags actually given on a parsed command line."""
    return {k: v for k, v in vars(args).items() if k in OPTIONS and (names is None or k in names)}
