"""One short check on the real embedded default (SmolLM2-135M-Instruct), converted on first use."""

import pytest

from quickdraft import Engine, EngineConfig
from quickdraft.drafters import make_drafter
from quickdraft.weights.loading import load_model

pytestmark = pytest.mark.real_model

PROMPT = "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def smollm_fp32():
    return load_model(None, "float32")


def test_default_model_loads_with_its_tokenizer_and_chat_template(smollm_fp32):
    assert smollm_fp32.vocab_size == 49152
    assert smollm_fp32.eos_token_ids == (2,)
    assert smollm_fp32.tokenizer.chat_template


@pytest.mark.parametrize("drafter", ["ngram", "truncated:4", "distilled", "distilled@bfloat16", "suffix"])
def test_greedy_sd_equals_plain_on_default_model_float32(smollm_fp32, drafter):
    ar = Engine(smollm_fp32, EngineConfig(method="ar"))
    sd = Engine(smollm_fp32, EngineConfig(method="sd"), drafter=make_drafter(drafter, smollm_fp32, "float32"))
    want = ar.generate(PROMPT, max_new_tokens=40)
    got = sd.generate(PROMPT, max_new_tokens=40)
    assert got.token_ids == want.token_ids
    assert "quick brown fox" in got.text
    assert got.stats.num_draft_tokens > 0
    if drafter == "ngram":
        assert got.stats.mean_acceptance_length > 1.5  # the repeat is found and accepted


def test_the_shipped_distilled_draft_belongs_to_the_default_target(smollm_fp32):
    import json

    from quickdraft.weights.delta import SHIPPED, shipped_delta_dir

    folder = shipped_delta_dir(smollm_fp32)
    assert folder.parent == SHIPPED
    meta = json.loads((folder / "distilled.json").read_text())
    assert meta["target"] == "SmolLM2-135M-Instruct" and "quickdraft distill" in meta["command"]
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size < 50 * 2**20  # "a few tens of MB at most"
    drafter = make_drafter("distilled", smollm_fp32)
    assert drafter.model.head_ids is not None and len(drafter.model.head_ids) == meta["head_vocab"]


@pytest.mark.parametrize("budget", [8, 16])
def test_greedy_suffix_trees_equal_plain_on_default_model_float32(smollm_fp32, budget):
    from quickdraft.settings.options import options_from

    ar = Engine(smollm_fp32, EngineConfig(method="ar"))
    sd = Engine(smollm_fp32, options_from({"drafter": "suffix", "draft_tree": budget}))
    for prompt in (PROMPT, "Write a Python function that checks whether a number is prime."):
        want = ar.generate(prompt, max_new_tokens=48)
        got = sd.generate(prompt, max_new_tokens=48)
        assert got.token_ids == want.token_ids
        assert got.stats.num_accepted_draft_tokens > 5  # the shipped datastore drafts and is accepted
