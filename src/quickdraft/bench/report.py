"""report.md from a benchmark's summary (and the plots beside it)."""

from __future__ import annotations

from pathlib import Path

from quickdraft.bench.plots import plot_acceptance_by_position, plot_speedup_by_category, plot_speedup_vs_draft_length


def _acceptance(method: str, s: dict) -> str:
    if s["num_draft_tokens"] == 0:
        return "n/a (not reported)" if method.startswith("hf-assisted") else "-"
    return f"{s['draft_acceptance_rate']:.3f}"


def _table(summary: dict) -> list[str]:
    lines = [
        "| method | tokens/s (± run std) | speedup vs ar (± std) | prefill tokens/s | SWI (cost model) "
        "| mean accepted tokens | draft acceptance | matches ar | PEARL MAT | tree nodes / accepted depth 0,1,2,... |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, s in summary["methods"].items():
        mat = s.get("pearl_mean_accepted_tokens")
        nodes, hist = s.get("tree_mean_nodes"), s.get("tree_accepted_depth_histogram")
        tree = "-" if nodes is None else f"{nodes:.1f} / {', '.join(map(str, hist or []))}"
        swi = "-" if s.get("swi") is None else f"{s['swi']:.2f}x"
        pearl = "-" if mat is None else f"{mat:.2f}"
        prefill = "-" if s.get("prefill_tokens_per_s") is None else f"{s['prefill_tokens_per_s']:.0f}"
        lines.append(
            f"| `{m}` | {s['tokens_per_s']:.2f} ± {s['tokens_per_s_std']:.2f} | {s['speedup_vs_ar']:.2f}x ± "
            f"{s['speedup_vs_ar_std']:.2f} | {prefill} | {swi} | {s['mean_accepted_tokens']:.2f} | "
            f"{_acceptance(m, s)} | {_match(s['lossless_match_rate'])} | {pearl} | {tree} |"
        )
    return lines


def _match(rate: float | None) -> str:
    """The lossless match cell: a share, or "sampled" (no one output expected)."""
    return "sampled" if rate is None else f"{rate:.0%}"


def _guard_note(summary: dict) -> list[str]:
    """The share of rounds that drafted, where the draft guard kept some plain."""
    shares = {m: s["drafted_round_share"] for m, s in summary["methods"].items() if s.get("drafted_round_share")}
    if not shares:
        return []
    head = "Rounds that drafted (the draft guard kept the others plain while drafting lost on this host's costs):"
    return [head, "", *(f"- `{m}`: {share:.0%}" for m, share in shares.items()), ""]


def _choices_note(summary: dict) -> list[str]:
    """What each method's defaults resolved to, and why (`settings/defaults.py`)."""
    choices = summary.get("choices") or {}
    if not choices:
        return []
    lines = ["What the defaults chose:", ""]
    for method, picked in choices.items():
        lines += [f"- `{method}`: {what} = {why}" for what, why in picked.items()]
    return [*lines, ""]


def _graphs_note(summary: dict) -> list[str]:
    """What capturing each method's graphs cost, outside its timing (a GPU's static forward)."""
    graphs = summary.get("graphs") or {}
    if not graphs:
        return []
    lines = ["Graphs captured at warm-up (not in the timed runs; late = captured inside a timed generation):", ""]
    for method, g in graphs.items():
        lines.append(
            f"- `{method}`: {g['graphs']} graphs in {g['capture_s']:.1f} s, {g['graph_mib']:.0f} MiB, "
            f"{g['late_captures']} late"
        )
    return [*lines, ""]


def _quantized_note(summary: dict) -> list[str]:
    quantized = {m: s for m, s in summary["methods"].items() if s.get("quantize")}
    if not quantized:
        return []
    base = summary["methods"].get("ar", {}).get("quantize", "none")
    lines = [
        "Methods on quantized weights run a different target: the quantized one. Their speedup above is over "
        f"`ar` ({'bf16/unquantized' if base == 'none' else base} weights); matches ar compares with plain "
        "decoding of the same weights (what lossless means for them; llama.cpp's own plain decoding for its "
        "weights). Over plain decoding of their own weights:",
        "",
    ]
    for m, s in quantized.items():
        own = s.get("speedup_vs_own_ar")
        agree = f"; output equal to our `ar`'s: {_match(s['agreement_with_ar'])}" if "agreement_with_ar" in s else ""
        lines.append(f"- `{m}` ({s['quantize']}): {'-' if own is None else f'{own:.2f}x'}{agree}")
    return [*lines, ""]


def _at_peak(at: dict[str, int] | None) -> str:
    """The peak's breakdown as text, e.g. ` (at that peak: bench 3,900 MiB, llama_cpp_worker.py 1,500 MiB).`;
    a plain `.` without one."""
    return f" (at that peak: {', '.join(f'{name} {mib:,} MiB' for name, mib in at.items())})." if at else "."


def _peer_notes(summary: dict) -> list[str]:
    """What died (a peer's process: its signal or exit) and which build each llama.cpp peer ran."""
    lines = []
    if summary.get("peak_rss_mib"):
        peak = summary["peak_rss_mib"]
        lines += [
            f"Peak memory (RSS): the bench {peak['bench']:,.0f} MiB"
            + "".join(f", `{name}`'s process {mib:,.0f} MiB" for name, mib in peak["children"].items())
            + f" (at most {peak['sum']:,.0f} MiB together)"
            + (
                f"; measured together (summed PSS, sampled): {peak['together_pss']:,.0f} MiB"
                + _at_peak(peak.get("at_peak_pss"))
                if peak.get("together_pss")
                else "."
            ),
            "",
        ]
    if summary.get("failed"):
        lines += ["Methods that failed and were left out (the others ran on):", ""]
        lines += [f"- `{m}`: {why}" for m, why in summary["failed"].items()]
        lines.append("")
    for m, info in summary.get("peer_builds", {}).items():
        runtime = "OpenVINO" if m.startswith("openvino") else "llama.cpp"  # ik_llama.cpp is a llama.cpp build
        lines += [f"`{m}` ran {runtime} built with: {' '.join(info.split())}", ""]
    return lines


def _category_table(summary: dict) -> list[str]:
    methods = [m for m in summary["methods"] if m != "ar"]
    cats = sorted({c for m in summary["methods"].values() for c in m["categories"]})
    lines = ["| category | " + " | ".join(f"`{m}`" for m in methods) + " |", "|---|" + "---|" * len(methods)]
    for c in cats:
        cells = []
        for m in methods:
            s = summary["methods"][m]["categories"].get(c)
            cells.append(f"{s['speedup_vs_ar']:.2f}x / {s['mean_accepted_tokens']:.2f}" if s else "-")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return lines


def render_report(summary: dict, plots: list[str]) -> str:
    cfg, mach = summary["config"], summary["machine"]
    lines = [
        f"## {cfg['prompts']}: {summary['prompt_set']['num_prompts']} prompts, {cfg['runs']} run(s), "
        f"{cfg['dtype']}, greedy, max {cfg['max_new_tokens']} new tokens",
        "",
        f"Command: `{cfg['command']}`" if cfg.get("command") else "",
        "",
        f"Machine: {mach['cpu']} ({mach['cpu_capability']}; flags: {', '.join(mach.get('cpu_flags', [])) or '?'}), "
        f"device {mach.get('device', 'cpu')}, {mach['threads']} torch threads, torch {mach['torch']}, "
        f"Python {mach['python']}; finished {summary['finished']}. Target: {cfg['target'] or 'SmolLM2-135M-Instruct'}"
        f"{'' if cfg.get('quantize', 'none') == 'none' else ' with ' + cfg['quantize'] + ' weights'}"
        f", runtime {cfg.get('runtime', 'hf')} (peers hf-*: transformers' own generate()).",
        "",
        "tokens/s = Σ new tokens / Σ wall seconds; speedup = the method's tokens/s over plain decoding's on "
        "the same prompts in the same run (mean over runs); SWI = CS Drafting's standardized walltime "
        "improvement, a cost model: new tokens / (target forwards + draft forwards x their measured step cost "
        "relative to the target's), model-free drafters cost 0; mean accepted tokens = new tokens per target "
        "forward, bonus included (1.00 for plain decoding); PEARL MAT = PEARL's own metric, tokens per run "
        "of accepted drafts up to a rejection (correction included), not comparable with the former; "
        "matches ar = share of outputs token-identical to plain decoding.",
        "",
        *_choices_note(summary),
        *_graphs_note(summary),
        *_quantized_note(summary),
        *_peer_notes(summary),
        *_guard_note(summary),
        *_table(summary),
        "",
        "Speedup / mean accepted tokens by category:",
        "",
        *_category_table(summary),
        "",
    ]
    if summary.get("batched"):
        lines += [
            "Batched: every prompt of a run in one continuous batch (`--batch`), against the same method one "
            "prompt at a time in this run:",
            "",
            "| method | max batch | batched tokens/s | one at a time tokens/s | ratio | outputs equal |",
            "|---|---|---|---|---|---|",
        ]
        for m, b in summary["batched"].items():
            lines.append(
                f"| {m} | {b['max_batch']} | {b['tokens_per_s']:.1f} | {b['one_at_a_time_tokens_per_s']:.1f} | "
                f"{b['throughput_ratio']:.2f}x | {b['matches_one_at_a_time']:.0%} |"
            )
        lines.append("")
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def write_plots(out: Path, summary: dict) -> list[str]:
    """Draw a run's plots into `out` from its summary (results.json); their file names."""
    plots = ["speedup_by_category.png", "acceptance_by_position.png"]
    plot_speedup_by_category(summary, out / plots[0])
    plot_acceptance_by_position(summary, out / plots[1])
    if plot_speedup_vs_draft_length(summary, out / "speedup_vs_draft_length.png"):
        plots.append("speedup_vs_draft_length.png")
    return plots


def write_report(out: Path, summary: dict, rows: list[dict]) -> Path:
    plots = write_plots(out, summary)
    path = out / "report.md"
    path.write_text(render_report(summary, plots))
    return path
