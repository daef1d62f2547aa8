"""OpenVINO GenAI as a bench peer (issue #69 item 4): plain decoding of the target's GGUF through its own
GGUF reader, in a child process, and its prompt lookup (`openvino:lookup=N`); an optional extra whose
absence (or a reader that refuses the file) is a one-line skip, never a crash; its own plain decoding
is its lossless reference."""

from __future__ import annotations

import importlib.util

import pytest

from quickdraft.bench.methods import build_method, parse_methods
from quickdraft.bench.peers.child import PeerSkipped
from quickdraft.bench.runner import _methods_with_ar
from quickdraft.errors import QuickdraftError

from conftest import bench_one_prompt

PROMPT = "Write a Python function that returns the sum of a list of numbers, then show an example call."


def _missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openvino_genai" else real(name, *a)
    )


def test_it_is_plain_decoding_of_its_own_weights():
    assert [s.text for s in _methods_with_ar("sd,openvino")] == ["ar", "sd", "openvino"]


@pytest.mark.parametrize("spec", ["openvino:lookup=4", "openvino:draft=qwen2.5-coder-0.5b"])
def test_its_speculation_is_compared_with_its_plain_decoding(spec):
    assert [s.text for s in _methods_with_ar(f"sd,{spec}")] == ["ar", "openvino", "sd", spec]


@pytest.mark.parametrize(
    "text,why",
    [
        ("openvino:lookup=0", "lookup must be an integer >= 1"),
        ("openvino:lookup=x", "lookup must be an integer >= 1"),
        ("openvino:draft=nowhere.gguf", "draft= takes a named model"),
        ("openvino:draft=qwen2.5-coder-0.5b,lookup=3", "choose one"),
        ("openvino:draft_max=3", "draft_max needs draft="),
        ("openvino:draft=qwen2.5-coder-0.5b,draft_max=-1", "draft_max must be an integer >= 1"),
    ],
)
def test_bad_speculation_keys_are_one_clear_line(tiny_target, text, why):
    with pytest.raises(QuickdraftError, match=why) as exc:
        build_method(parse_methods(text)[0], tiny_target, "float32")
    assert "\n" not in str(exc.value)


def test_a_missing_extra_is_a_one_line_skip(monkeypatch, tiny_target):
    _missing(monkeypatch)
    with pytest.raises(PeerSkipped, match=r'skipped: .*pip install -e "\.\[openvino\]"') as exc:
        build_method(parse_methods("openvino")[0], tiny_target, "float32")
    assert "\n" not in str(exc.value)


@pytest.mark.slow
def test_it_decodes_the_embedded_default_where_installed(tmp_path):
    if importlib.util.find_spec("openvino_genai") is None:  # found, not imported: it loads in its child
        pytest.skip('the openvino extra is not installed (pip install -e ".[openvino]")')
    summary = bench_one_prompt(tmp_path, "ar,openvino", PROMPT, 16)
    if "openvino" in summary.get("failed", {}):  # its reader may refuse the default's blocks: one line
        assert "skipped" in summary["failed"]["openvino"] and "\n" not in summary["failed"]["openvino"]
        pytest.skip(f"openvino refused the embedded default: {summary['failed']['openvino']}")
    peer = summary["methods"]["openvino"]
    assert peer["quantize"] == "openvino:gguf" and peer["lossless_match_rate"] == 1.0
    assert peer["tokens_per_s"] > 0 and peer["prefill_tokens_per_s"] > 0


@pytest.mark.slow
def test_its_prompt_lookup_drafts_where_installed(tmp_path):
    """`openvino:lookup=3` on a prompt whose answer repeats it: fewer forwards than tokens (drafts
    were kept), its tokens compared with its own plain decoding's."""
    if importlib.util.find_spec("openvino_genai") is None:
        pytest.skip('the openvino extra is not installed (pip install -e ".[openvino]")')
    repeat = "Repeat this line exactly, three times: the quick brown fox jumps over the lazy dog."
    summary = bench_one_prompt(tmp_path, "ar,openvino,openvino:lookup=3", repeat, 48)
    if "openvino" in summary.get("failed", {}):  # its reader may refuse the default's blocks: one line
        pytest.skip(f"openvino refused the embedded default: {summary['failed']['openvino']}")
    lookup = summary["methods"]["openvino:lookup=3"]
    assert lookup["quantize"] == "openvino:gguf" and lookup["mean_accepted_tokens"] > 1.0  # speculation happened
    assert lookup["lossless_match_rate"] is not None


@pytest.mark.slow
def test_its_draft_model_speculation_where_installed(tmp_path, monkeypatch):
    """`openvino:draft=FILE.gguf` with the target's own file as its draft (requantized to Q8_0 and
    converted to an OpenVINO folder once, in the cache): drafts kept, fewer forwards than tokens."""
    if importlib.util.find_spec("openvino_genai") is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip('needs the openvino and peers extras (pip install -e ".[openvino,peers]")')
    from quickdraft.weights.loading import load_model

    target = load_model(None, "bfloat16")
    if target.gguf is None:
        pytest.skip("the embedded default was not loaded from a GGUF file")
    spec = f"openvino:draft={target.gguf},draft_max=4"
    summary = bench_one_prompt(tmp_path, f"ar,openvino,{spec}", PROMPT, 32, target)
    if "openvino" in summary.get("failed", {}) or spec in summary.get("failed", {}):  # a refused file: one line
        assert all("\n" not in why for why in summary["failed"].values())
        pytest.skip(f"openvino refused a file: {'; '.join(summary['failed'].values())}")
    drafted = summary["methods"][spec]
    assert drafted["quantize"] == "openvino:gguf" and drafted["mean_accepted_tokens"] > 1.0  # speculation happened
