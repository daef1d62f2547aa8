"""Issue #80 item 3: no benchmark figure in source. Docstrings and comments say what code does; figures
(ratios such as "1.57x", throughputs such as "310 tokens/s", timings beside a host's name) go stale with
every kernel and live in docs/benchmarks.md. Code that prints or labels a figure (an f-string, a
report's column header) is not a figure. The control: a planted figure of each kind is found."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "quickdraft"
RATIO = re.compile(r"(?<![\w.])\d+(\.\d+)?x(?![\w])")  # 1.57x, 10x (not 0x1F, not 2x2)
THROUGHPUT = re.compile(r"\d+(\.\d+)?\s*(tokens|tok|prompt tokens)/s\b")
HOST = re.compile(r"\b(EPYC|Xeon|Sapphire Rapids|Zen ?\d|H100|H200|A100|M[1-4] (Pro|Max))\b")
TIMING = re.compile(r"\d+(\.\d+)?\s*(ms|us|s|%|GB|MB|GiB|MiB)\b")
MEASURE = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")  # 0.375 (of a step), near a host's name


def figures(text: str) -> list[str]:
    """Lines of `text` that quote a figure: a ratio, a throughput, or a timing within a line of a host's
    name (a comment's sentence runs over lines)."""
    lines = text.splitlines()
    hosts = {n for n, line in enumerate(lines) if HOST.search(line)}
    found = []
    for n, line in enumerate(lines):
        near_host = bool(hosts & {n - 1, n, n + 1})
        measured = TIMING.search(line) or MEASURE.search(line)
        if RATIO.search(line) or THROUGHPUT.search(line) or (near_host and measured):
            found.append(f"{n + 1}: {line.strip()}")
    return found


def test_no_source_file_quotes_a_benchmark_figure():
    found = {}
    for path in sorted([*SRC.rglob("*.py"), *SRC.rglob("*.h"), *SRC.rglob("*.cpp")]):
        hits = figures(path.read_text())
        if hits:
            found[str(path.relative_to(SRC))] = hits
    assert found == {}


def test_a_planted_figure_of_each_kind_is_found():  # negative control
    planted = "\n".join(
        [
            "# the pair ran 1.57x llama.cpp here",
            '"""It decodes 310 tokens/s."""',
            "// 0.7 ms of a 4.4 ms step on an AMD EPYC",
            "// measured on an H200 (2 threads):",
            "// 3.6 ms of attention",
            "x = 0x1F  # not a figure",
            "a 2x2 matrix and tokens/s as a label",
            "",
            "# its step is 0.375 of a bf16 step on an AMD EPYC",
            "",
            "",
            "# version 2.13 of torch",
        ]
    )
    assert [line.split(":")[0] for line in figures(planted)] == ["1", "2", "3", "5", "9"]
