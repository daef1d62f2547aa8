"""ik_llama.cpp as a bench peer (issue #69 item 4): plain decoding of the target's GGUF in a child
process; an optional extra whose absence (or a build that refuses the model) is a one-line skip in the
report, never a crash; its own plain decoding is its lossless reference, as llama.cpp's is."""

from __future__ import annotations

import importlib.util

import pytest

from quickdraft import QuickdraftError
from quickdraft.bench.methods import build_method, parse_methods
from quickdraft.bench.peers.child import PeerSkipped
from quickdraft.bench.runner import _methods_with_ar

from conftest import bench_one_prompt

PROMPT = "Write a Python function that returns the sum of a list of numbers, then show an example call."


def test_it_is_plain_decoding_of_its_own_weights():
    specs = _methods_with_ar("sd,ik-llama-cpp")
    assert [s.text for s in specs] == ["ar", "sd", "ik-llama-cpp"]  # its own plain reference: itself
    with pytest.raises(QuickdraftError, match="no option 'lookup'"):
        parse_methods("ik-llama-cpp:lookup=2")


@pytest.mark.parametrize("value", ["2", "yes"])
def test_a_bad_repack_is_one_clear_line(tiny_target, value):
    with pytest.raises(QuickdraftError, match="repack must be 0 or 1") as exc:
        build_method(parse_methods(f"ik-llama-cpp:repack={value}")[0], tiny_target, "float32")
    assert "\n" not in str(exc.value)


def test_a_missing_extra_is_a_one_line_skip(monkeypatch, tiny_target):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ik_llama_cpp" else real(name, *a)
    )
    with pytest.raises(PeerSkipped, match=r'skipped: .*pip install -e "\.\[ik\]"') as exc:
        build_method(parse_methods("ik-llama-cpp")[0], tiny_target, "float32")
    assert "\n" not in str(exc.value)


def test_the_bench_goes_on_without_it(monkeypatch, tmp_path):
    """A run asking for ik-llama-cpp where it is not installed: the other methods run, the report
    names the skip in one line."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ik_llama_cpp" else real(name, *a)
    )
    summary = bench_one_prompt(tmp_path, "ar,ik-llama-cpp", PROMPT, 4)
    assert "ar" in summary["methods"] and "ik-llama-cpp" not in summary["methods"]
    assert "not installed" in summary["failed"]["ik-llama-cpp"]


@pytest.mark.slow
def test_it_decodes_the_embedded_default_where_installed(tmp_path):
    if importlib.util.find_spec("ik_llama_cpp") is None:  # found, not imported: it loads in its child
        pytest.skip('the ik extra is not installed (pip install -e ".[ik]")')
    summary = bench_one_prompt(tmp_path, "ar,ik-llama-cpp", PROMPT, 16)
    peer = summary["methods"]["ik-llama-cpp"]
    assert peer["quantize"] == "ik-llama-cpp:gguf" and peer["lossless_match_rate"] == 1.0
    assert 0.0 <= peer["agreement_with_ar"] <= 1.0 and peer["tokens_per_s"] > 0 and peer["prefill_tokens_per_s"] > 0
    assert summary["peer_builds"]["ik-llama-cpp"]  # the build's instruction sets are named


def test_the_install_script_adds_the_sdists_missing_build_script(tmp_path):
    import importlib.util as iu
    from pathlib import Path

    path = Path(__file__).parents[1] / "scripts" / "install_ik_llama_cpp.py"
    spec = iu.spec_from_file_location("install_ik", path)
    module = iu.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.patch(tmp_path) is True  # added
    script = tmp_path / "vendor/ik_llama.cpp/common/cmake/build-info-gen-cpp.cmake"
    assert "configure_file" in script.read_text() and "build-info.cpp.in" in script.read_text()
    assert module.patch(tmp_path) is False  # already there: left as it is


@pytest.mark.slow
def test_its_repacked_copy_where_installed(tmp_path):
    """`ik-llama-cpp:repack=1` on the 1.5B's Q4_K_M file (where it is prepared): a copy whose Q4_K and Q6_K
    tensors take their interleaved types, decoded as plain decoding of the same weights."""
    if importlib.util.find_spec("ik_llama_cpp") is None:
        pytest.skip('the ik extra is not installed (pip install -e ".[ik]")')
    from gguf import GGUFReader

    from quickdraft.bench.peers.ik_llama_cpp_peer import repacked
    from quickdraft.weights.default import named_gguf

    try:
        source = named_gguf("qwen2.5-coder-1.5b")
    except QuickdraftError as exc:
        pytest.skip(f"the 1.5B is not prepared here: {exc}")
    copy = repacked(source, "ik-llama-cpp:repack=1")
    assert copy != source and abs(copy.stat().st_size - source.stat().st_size) < 0.01 * source.stat().st_size
    assert {t.tensor_type.name for t in GGUFReader(source).tensors} >= {"Q4_K", "Q6_K"}
    with pytest.raises(ValueError):  # its tensors have ik_llama.cpp's interleaved types, unknown to gguf-py
        GGUFReader(copy)
