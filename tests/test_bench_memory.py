"""The bench's memory of all its processes together (bench/memory.py): summed PSS, sampled."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quickdraft.bench.memory import TreePeak, descendants, pss_kib, tree_pss_kib

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps_rollup").is_file(), reason="needs Linux's smaps_rollup")

HOLD = 300  # MiB a child touches and holds

CHILD = f"""
import sys, time
b = bytearray({HOLD} * 2**20)
b[::4096] = b"x" * len(b[::4096])  # touch every page: resident, not just reserved
print("ready", flush=True)
sys.stdin.readline()
"""


def _child():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_child_holding_memory_is_in_the_tree_and_its_sum():
    me = os.getpid()
    before = sum(tree_pss_kib(me).values())
    proc = _child()
    try:
        assert proc.pid in descendants(me)
        assert pss_kib(proc.pid) >= HOLD * 1024 * 0.9
        assert sum(tree_pss_kib(me).values()) - before >= HOLD * 1024 * 0.9
    finally:
        proc.communicate("\n")
    # negative control: once it exited, the child and its memory are gone from the tree
    assert proc.pid not in descendants(me)
    assert pss_kib(proc.pid) == 0
    assert sum(tree_pss_kib(me).values()) - before < HOLD * 1024 * 0.5


def test_the_sampler_keeps_the_peak_a_child_reached_after_it_exits():
    peak = TreePeak(os.getpid(), interval=0.05).start()
    baseline = peak.sample()
    proc = _child()
    time.sleep(0.3)  # a few samples while it holds its memory
    proc.communicate("\n")
    mib = peak.stop()
    assert peak.samples >= 3
    assert mib * 1024 - baseline >= HOLD * 1024 * 0.9
    assert peak.sample() < peak.peak_kib  # now: the child's pages are no longer counted
    assert peak.at_peak["bench"] > 0 and peak.at_peak["python -c"] >= HOLD * 0.9  # what each held at the peak


needs_ops = pytest.mark.skipif(
    __import__("quickdraft.runtime.kernels", fromlist=["x"]).fused_ops() is None, reason="no fused kernels here"
)


@needs_ops
def test_drafters_of_one_quantized_draft_share_its_weights(tiny_model_dir):
    """The bench builds every method up front: methods drafting with the same `model:...;quant=` draft
    hold one copy of its quantized linears (while any of them lives), not one each."""
    from quickdraft.drafters import make_drafter
    from quickdraft.drafters.spec import parse_drafter_spec
    from quickdraft.weights.loading import load_model

    target = load_model(tiny_model_dir, "float32")
    stages = parse_drafter_spec(f"model:{tiny_model_dir};quant=w4a8")
    a, b = make_drafter(stages, target, "float32"), make_drafter(stages, target, "float32")
    assert a.weights is not None and a.weights is b.weights
    assert a.weights.linears and all(a.weights.linears[n] is b.weights.linears[n] for n in a.weights.linears)
    # negative control: another form of the same draft is another copy
    other = make_drafter(parse_drafter_spec(f"model:{tiny_model_dir};quant=w8a8"), target, "float32")
    assert other.weights is not a.weights


def test_the_bench_reports_the_memory_of_all_its_processes(tiny_model_dir, tmp_path):
    from quickdraft.bench.runner import BenchConfig, run_bench

    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"question_id": 1, "category": "x", "turns": ["abc abc abc"]}\n')
    cfg = BenchConfig(methods="ar", prompts=str(prompts), max_new_tokens=4, runs=1, target=tiny_model_dir,
                      dtype="float32", out=str(tmp_path / "out"))  # fmt: skip
    peak = run_bench(cfg, progress=False)["peak_rss_mib"]
    assert 0 < peak["together_pss"] <= peak["sum"]  # shared pages counted once, never more than the peaks' sum
    assert "measured together (summed PSS, sampled)" in (tmp_path / "out" / "report.md").read_text()
    # a process already running under this one (parallel PEARL's forkserver lingers so) is in both figures
    proc = _child()
    try:
        peak = run_bench(cfg, progress=False)["peak_rss_mib"]
    finally:
        proc.communicate("\n")
    assert peak["children"]["python -c"] >= HOLD * 0.9
    assert HOLD * 0.9 <= peak["together_pss"] <= peak["sum"]
