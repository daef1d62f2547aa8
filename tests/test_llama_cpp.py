"""llama.cpp as a bench peer (bench/peers/llama_cpp_peer.py): the pure acceptance count, option errors, the missing
extra's message, and on the embedded default's GGUF (the `peers` extra installed): plain greedy decoding
agreeing with ours, prompt lookup equal to llama.cpp's own plain decoding, a requantized copy cached,
and a bench run reporting agreement apart from the lossless match. llama.cpp runs in a child process
(`bench/peers/child.py`): a build that dies on this host fails a test, it cannot kill the suite."""

import importlib.util
import json

import pytest

from quickdraft import QuickdraftError
from quickdraft.bench.methods import build_method, parse_methods
from quickdraft.bench.peers.llama_cpp_peer import WORKERS, lookup_accepted, quantized_copy
from quickdraft.bench.runner import BenchConfig, _methods_with_ar, run_bench


def test_lookup_accepted_counts_each_draft_up_to_its_first_miss():
    prompt, out = 3, [10, 11, 12, 13]
    # drafted after 3 tokens (prompt only): 10, 11 match, 99 misses; after 5: 12 matches, 0 misses
    assert lookup_accepted(prompt, out, [(3, [10, 11, 99]), (5, [12, 0]), (7, [5])]) == 3
    assert lookup_accepted(prompt, out, []) == 0


def test_llama_cpp_options_are_checked():
    assert [s.text for s in parse_methods("ar,llama-cpp:quantize=q4_0,llama-cpp:lookup=2")] == [
        "ar",
        "llama-cpp:quantize=q4_0",
        "llama-cpp:lookup=2",
    ]
    with pytest.raises(QuickdraftError, match="no option 'draft_length'"):
        parse_methods("llama-cpp:draft_length=2")
    with pytest.raises(QuickdraftError, match="quantize must be one of"):
        quantized_copy(__import__("pathlib").Path("x.gguf"), "q3_k")


def test_plain_llama_cpp_is_added_for_its_lookup():
    texts = [s.text for s in _methods_with_ar("llama-cpp:lookup=2")]
    assert texts == ["ar", "llama-cpp:quantize=gguf", "llama-cpp:lookup=2"]


def test_a_missing_extra_is_a_clear_error(monkeypatch, tiny_target):
    real = importlib.util.find_spec  # llama_cpp is looked for, not imported: it loads in a child process

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(QuickdraftError, match=r'pip install -e "\.\[peers\]"'):
        build_method(parse_methods("llama-cpp")[0], tiny_target, "float32")


@pytest.fixture(scope="module")
def smollm():
    pytest.importorskip("llama_cpp", reason='the peers extra is not installed (pip install -e ".[peers]")')
    from quickdraft.weights.loading import load_model

    return load_model(None, "bfloat16")


PROMPT = "Write a Python function that returns the sum of a list of numbers, then show an example call."


@pytest.mark.real_model
def test_llama_cpp_plain_and_lookup_on_the_default_gguf(smollm):
    from quickdraft.prompts import PromptCodec

    ids = PromptCodec.for_target(smollm).encode(PROMPT)
    ours = build_method(parse_methods("ar")[0], smollm, "bfloat16").run(ids, 24)
    plain = build_method(parse_methods("llama-cpp")[0], smollm, "bfloat16")
    lookup = build_method(parse_methods("llama-cpp:lookup=3")[0], smollm, "bfloat16")
    a, b = plain.run(ids, 24), lookup.run(ids, 24)
    assert len(a.token_ids) == a.target_forwards == 24  # the prefill, then one forward a token
    assert a.token_ids[:8] == ours.token_ids[:8]  # the same model (its 4-bit weights) on the same prompt
    assert b.token_ids == a.token_ids  # llama.cpp's greedy lookup is lossless against its own plain decoding
    assert b.num_draft_tokens > 0 and b.num_accepted > 0 and b.target_forwards < a.target_forwards
    assert plain.child is lookup.child  # one worker for the model: its weights loaded once
    again = plain.run(ids, 24)  # plain again after lookup runs in the same worker: still plain
    assert again.token_ids == a.token_ids and again.target_forwards == 24 and again.num_draft_tokens == 0
    plain.close()
    assert lookup.run(ids, 24).token_ids == a.token_ids  # the worker lives while a user does
    lookup.close()
    assert not WORKERS  # the last user stopped it


@pytest.mark.real_model
def test_a_requantized_copy_is_made_once_and_cached(smollm, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    path = quantized_copy(smollm.gguf, "q8_0")
    assert path.parent == tmp_path / "llama_cpp" and path.exists()
    stamp = path.stat().st_mtime_ns
    assert quantized_copy(smollm.gguf, "q8_0") == path and path.stat().st_mtime_ns == stamp


@pytest.mark.real_model
def test_bench_reports_llama_cpp_agreement_apart_from_the_lossless_match(smollm, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": "1", "category": "a", "turns": [PROMPT]}) + "\n")
    config = BenchConfig(methods="ar,llama-cpp:lookup=2", prompts=str(prompts), max_new_tokens=16, runs=1)
    config.out = str(tmp_path / "out")
    summary = run_bench(config, smollm, progress=False)
    peer = summary["methods"]["llama-cpp:lookup=2"]
    assert peer["quantize"] == "llama-cpp:gguf" and peer["lossless_match_rate"] == 1.0
    assert 0.0 <= peer["agreement_with_ar"] <= 1.0 and peer["speedup_vs_own_ar"] is not None
    assert (
        peer["prefill_tokens_per_s"] > 0 and summary["methods"]["llama-cpp:quantize=gguf"]["prefill_tokens_per_s"] > 0
    )
    assert "llama-cpp:quantize=gguf" in summary["methods"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "output equal to our `ar`'s" in report
    assert "`llama-cpp:lookup=2` ran llama.cpp built with: CPU :" in report  # the peer's build is named
    assert "AMX_INT8 = 1" not in summary["peer_builds"]["llama-cpp:lookup=2"]  # the README's build: AMX off


@pytest.mark.real_model
def test_lookup_runs_past_one_batch_of_positions(smollm):
    lookup = build_method(parse_methods("llama-cpp:lookup=2")[0], smollm, "bfloat16")
    out = lookup.run(list(range(100, 700)), 8)  # 600 prompt positions: past llama-cpp-python's n_batch of 512
    assert len(out.token_ids) == 8
    lookup.close()
