"""`quickdraft kernels`: this host's kind, the fused kernels' level, the bf16 linear the runtime takes,
and every linear kernel's cost at 1 to 33 rows per weight form (`costs/kernel_curve.py`), with the
fastest kernel at each width and the fastest exact one; `--out DIR` keeps report.md, points.json and
curve.png."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quickdraft.errors import QuickdraftError


def add_kernels_parser(sub) -> None:
    from quickdraft.costs.kernel_curve import FORMS, SHAPE, WIDTHS

    p = sub.add_parser("kernels", help="this host's linear kernels at every width (the curve and the choice)")
    p.add_argument("--forms", default=",".join(FORMS), help=f"weight forms, comma-separated ({', '.join(FORMS)})")
    p.add_argument("--rows", default=",".join(map(str, WIDTHS)), help="widths, comma-separated, the first one row")
    p.add_argument("--shape", default=f"{SHAPE[0]}x{SHAPE[1]}", help="OUTxIN of the linear (IN a multiple of 256)")
    p.add_argument("--rounds", type=int, default=3, help="each (kernel, width) timed this many times over")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--out", default=None, help="a folder for report.md, points.json and curve.png")
    p.set_defaults(func=_cmd_kernels)


def _parse(args: argparse.Namespace) -> tuple[list[str], list[int], tuple[int, int]]:
    from quickdraft.costs.kernel_curve import FORMS

    forms = [f for f in args.forms.split(",") if f]
    if not forms or set(forms) - set(FORMS):
        raise QuickdraftError(f"--forms {args.forms!r}: choose from {', '.join(FORMS)}")
    try:
        rows = [int(r) for r in args.rows.split(",")]
        out, k = (int(v) for v in args.shape.lower().split("x"))
    except ValueError:
        raise QuickdraftError(
            f"--rows {args.rows!r} / --shape {args.shape!r}: integers, e.g. 1,9,17 and 8960x1536"
        ) from None
    if rows[:1] != [1] or min(rows) < 1 or rows != sorted(set(rows)):
        raise QuickdraftError(f"--rows {args.rows!r}: increasing widths starting at 1")
    if out < 16 or out % 16 or k < 256 or k % 256:
        raise QuickdraftError(f"--shape {args.shape!r}: OUT a multiple of 16, IN a multiple of 256")
    if args.rounds < 1:
        raise QuickdraftError(f"--rounds must be >= 1, got {args.rounds}")
    return forms, rows, (out, k)


def host_lines(shape: tuple[int, int]) -> list[str]:
    """The host kind, the fused kernels' level, the bf16 linear the runtime chose for this host and the
    one a weight of `shape` takes (another where the host's is not exact at that shape)."""
    from quickdraft.host import machine_info
    from quickdraft.runtime import kernels
    from quickdraft.runtime.kernels.linear import kind_for, packing

    info = machine_info()
    level = kernels.chosen_level() if kernels.fused_ops() is not None else "none (no fused kernels)"
    return [
        f"host: {info['cpu']} ({', '.join(info['cpu_flags']) or 'no AVX2'}), {info['threads']} threads, "
        f"torch {info['torch']} ({info['cpu_capability']})",
        f"fused kernels: {level}; bf16 linears take: {packing() or 'F.linear'}, and at {shape[0]}x{shape[1]} "
        f"{kind_for(shape) or 'F.linear'} (the lossless default: a kernel exact at every width for each weight "
        "shape, so a verify rounds as the one-row step)",
    ]


def _cmd_kernels(args: argparse.Namespace) -> int:
    import torch

    from quickdraft.costs import kernel_curve

    forms, rows, shape = _parse(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    head = host_lines(shape)
    print("\n".join(head), flush=True)
    points = kernel_curve.measure(forms, rows, shape, args.rounds, lambda s: print(s, file=sys.stderr, flush=True))
    note = (
        f"One {shape[0]}x{shape[1]} linear, bf16 rows: ms a call at one row, then steps (ms over that kernel's "
        "one-row ms) at each width; * where a width's result is not the bits of one-row calls."
    )
    report = "\n\n".join(["\n".join(f"- {line}" for line in head), note, kernel_curve.table(points)]) + "\n"
    print(report)
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        command = "quickdraft kernels " + " ".join(sys.argv[2:])
        (folder / "report.md").write_text(f"# Linear kernels by width\n\n`{command}`\n\n{report}")
        (folder / "points.json").write_text(json.dumps(kernel_curve.as_json(points), indent=1) + "\n")
        title = head[0].removeprefix("host: ").split(", torch")[0]
        kernel_curve.plot(points, str(folder / "curve.png"), title)
        print(f"wrote {folder}/report.md, points.json, curve.png")
    return 0
