"""`quickdraft kernels` and `costs/kernel_curve.py` (issue #69 items 1 and 5): every kernel of every
weight form timed at every width, exactness probed (with a control that proves the probe can fail),
the choice per width, the report's files, and bad arguments refused in one line. Speed itself is
measured by the command and written down, never asserted here."""

from __future__ import annotations

import json

import pytest
import torch

from quickdraft.cli import main
from quickdraft.costs import kernel_curve
from quickdraft.runtime import kernels

needs_kernels = pytest.mark.skipif(kernels.fused_ops() is None, reason="needs the fused CPU kernels")


@needs_kernels
def test_every_kernel_of_every_form_at_every_width():
    points = kernel_curve.measure(("bf16", "Q4_K", "Q8_0"), (1, 2, 5), (32, 256), rounds=1)
    seen = {(p.form, p.kernel, p.rows) for p in points}
    kinds = {p.kernel for p in points if p.form == "bf16"}
    assert {"torch", "fused"} <= kinds
    assert seen == {(f, k, r) for f, k in {(p.form, p.kernel) for p in points} for r in (1, 2, 5)}
    assert all(p.ms > 0 for p in points) and all(p.steps == 1.0 for p in points if p.rows == 1)
    # our tiles quantize each row alone and sum in a fixed order: a k-row call is k one-row calls
    assert all(p.exact for p in points if p.kernel in ("fused", "ours"))
    picks = kernel_curve.choices(points)
    assert set(picks) == {"bf16", "Q4_K", "Q8_0"} and set(picks["bf16"]) == {1, 2, 5}
    assert all(exact in kinds for fastest, exact in picks["bf16"].values())
    assert "| Q4_K | ours |" in kernel_curve.table(points)


def test_the_exactness_probe_can_fail():  # negative control: a kernel whose rows see each other
    x = torch.randn(4, 8)
    assert kernel_curve._exact(lambda r: r * 2, x)
    assert not kernel_curve._exact(lambda r: r - r.mean(0, keepdim=True), x)


def test_the_choice_names_the_fastest_and_the_fastest_exact_kernel():
    P = kernel_curve.Point
    points = [P("bf16", "a", 1, 1.0, 1.0, True), P("bf16", "b", 1, 2.0, 1.0, True)]
    points += [P("bf16", "a", 9, 5.0, 5.0, True), P("bf16", "b", 9, 3.0, 1.5, False)]
    assert kernel_curve.choices(points) == {"bf16": {1: ("a", "a"), 9: ("b", "a")}}
    assert "b (exact: a)" in kernel_curve.table(points) and "1.50*" in kernel_curve.table(points)


@needs_kernels
def test_the_command_prints_the_host_and_writes_its_report(tmp_path, capsys):
    out = tmp_path / "k"
    args = ["kernels", "--forms", "Q4_0", "--rows", "1,3", "--shape", "32x256", "--rounds", "1", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "host:" in text and "fused kernels:" in text and "| Q4_0 | ours |" in text
    assert {p.name for p in out.iterdir()} == {"report.md", "points.json", "curve.png"}
    assert {p["rows"] for p in json.loads((out / "points.json").read_text())} == {1, 3}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--forms", "fp8"], "--forms"),
        (["--rows", "2,3"], "--rows"),
        (["--rows", "1,x"], "--rows"),
        (["--shape", "30x256"], "--shape"),
        (["--rounds", "0"], "--rounds"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(capsys, extra, message):
    assert main(["kernels", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
