"""Issue #67: what runs when the user leaves a choice open (`settings/defaults.py`,
`drafters/draft_models/fast_form.py`, `drafters/draft_models/ranking.py`): the target's weights, the drafter,
a draft model's fast form, each with a reason in the statistics; every explicit option wins; the defaults
stay lossless."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from quickdraft.drafters.draft_models import fast_form
from quickdraft.drafters.draft_models.ranking import rank_ids, vocab_key
from quickdraft.engine import Engine
from quickdraft.settings import defaults
from quickdraft.settings.options import EngineConfig, options_from

from conftest import FLAT_CURVE, char_tokenizer, tiny_llama, tiny_text_model


def _gguf_born(name: str = "some-model-q4_k_m"):
    return dataclasses.replace(tiny_llama(), name=name, gguf=Path("/nowhere/some-model.gguf"))


def test_a_gguf_born_target_runs_its_own_blocks_unless_they_cannot_run(monkeypatch):
    stored = {"model.layers.0.mlp.down_proj.weight": "Q4_K", "lm_head.weight": "Q6_K"}
    monkeypatch.setattr(defaults, "gguf_types", lambda path, config: stored)
    assert defaults.auto_weights(_gguf_born(), "bfloat16", "auto", "cpu").value == "w4a8"
    assert defaults.auto_weights(_gguf_born(), "float32", "native", "cpu").value == "w4a8"
    for dtype, runtime, why in (("float64", "auto", "float64"), ("bfloat16", "hf", "--runtime hf")):
        choice = defaults.auto_weights(_gguf_born(), dtype, runtime, "cpu")
        assert choice.value == "none" and why in choice.reason
    assert defaults.auto_weights(tiny_llama(), "bfloat16", "auto", "cpu").value == "none"  # a folder's own weights
    default = _gguf_born("SmolLM2-135M-Instruct")
    assert defaults.auto_weights(default, "bfloat16", "auto", "cpu").value == "w4a8"  # measured: docs/benchmarks.md
    stored["model.layers.0.mlp.up_proj.weight"] = "IQ2_XXS"  # no format runs it: the conversion, and why
    choice = defaults.auto_weights(_gguf_born(), "bfloat16", "auto", "cpu")
    assert choice.value == "none" and "IQ2_XXS" in choice.reason


def test_a_known_draft_mixes_with_suffix_branches_only_where_they_pay(monkeypatch, tmp_path):
    """The rule reads this host's verify curve: on a flat one (an AVX-512 host's) suffix branches pay,
    so `mix:`; on a steep one (each row a whole step: the control) the draft drafts alone."""
    target = tiny_llama(seed=4)
    monkeypatch.setattr(defaults, "known_draft", lambda t: "some-draft")
    native = Engine(target, EngineConfig(method="ar")).target
    monkeypatch.setattr(defaults.curves, "cost_curve", lambda *a, **k: dict(FLAT_CURVE))
    choice = defaults.auto_drafter(target, native, "float32", "none", "auto")
    assert choice.value == "mix:model:some-draft" and "pay" in choice.reason
    monkeypatch.setattr(defaults.curves, "cost_curve", lambda *a, **k: {w: float(w) for w in (1, 2, 3, 5, 9, 17)})
    choice = defaults.auto_drafter(target, native, "float32", "none", "auto")
    assert choice.value == "model:some-draft" and "alone" in choice.reason
    assert defaults.auto_drafter(target, native, "float32", "none", "hf").value == "model:some-draft"
    monkeypatch.setattr(defaults, "known_draft", lambda t: None)
    assert defaults.auto_drafter(target, native, "float32", "none", "auto").value == "suffix"


def test_the_engine_resolves_the_defaults_and_reports_why(flat_costs):
    target = tiny_text_model(seed=2)
    engine = Engine(target, EngineConfig())
    assert engine.config.quantize == "none" and engine.config.drafter == "suffix"
    assert engine.drafter.name == "suffix" and set(engine.choices) == {"weights", "drafter"}
    out = engine.generate("abcabcabc", max_new_tokens=8)
    assert "drafter suffix" in out.stats.ran["choice"] and "weights none" in out.stats.ran["choice"]
    explicit = Engine(target, options_from({"drafter": "ngram", "quantize": "none"}))
    assert explicit.choices == {} and "choice" not in explicit.ran()  # every explicit option wins


def test_the_cli_prints_the_choice(tiny_model_dir, capsys):
    from quickdraft.cli import main

    assert main(["generate", "abcabc", "--target", tiny_model_dir, "--max-new-tokens", "4"]) == 0
    assert "defaults                weights none" in capsys.readouterr().out


def _saved(model, folder: Path) -> str:
    model.model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_draft_model_runs_its_fast_form_unless_told_otherwise(tmp_path, monkeypatch, flat_costs):
    """`model:PATH` alone: 4-bit blocks for every linear, a 256-token window; each option given wins;
    greedy output stays plain decoding's, and the draft drafts. Tiny drafts keep their weights (the
    MIN_PARAMS rule, lowered here so a tiny model takes the fast form)."""
    draft = _saved(tiny_text_model(seed=8), tmp_path / "draft")  # the character tokenizer: 70 ids
    target = tiny_text_model(seed=9)
    ar = Engine(target, EngineConfig(method="ar"))
    small = Engine(target, options_from({"drafter": f"model:{draft}"}))
    assert small.drafter.weights is None and small.drafter.window.size is None  # under MIN_PARAMS: as loaded
    monkeypatch.setattr(fast_form, "MIN_PARAMS", 0)
    fast = Engine(target, options_from({"drafter": f"model:{draft}", "draft_length": 3, "guard": False}))
    assert str(fast.drafter.weights.spec) == "w4a8-all" and fast.drafter.window.size == fast_form.WINDOW
    plain = Engine(target, options_from({"drafter": f"model:{draft};quant=none;vocab=all;window=all"}))
    assert plain.drafter.weights is None and plain.drafter.window.size is None
    for prompt in ("abcabcabc", "hello hello"):
        a, b = ar.generate(prompt, max_new_tokens=12), fast.generate(prompt, max_new_tokens=12)
        assert b.token_ids == a.token_ids and b.stats.num_draft_tokens > 0


def test_a_large_vocabulary_gets_a_restricted_head_of_ranked_ids(monkeypatch):
    monkeypatch.setattr(fast_form, "MIN_PARAMS", 0)
    model = tiny_llama(vocab=96).model
    assert fast_form.fast_form(model, 96, "auto").vocab is None  # under twice VOCAB: the whole head
    monkeypatch.setattr(fast_form, "VOCAB", 32)
    assert fast_form.fast_form(model, 96, "auto").vocab == "32"
    assert fast_form.fast_form(model.double(), 96, "auto").quant is None  # float64: as loaded
    assert fast_form.fast_form(model.float(), 96, "hf").quant is None
    assert fast_form.fast_form(model.float(), 96, "auto", "cuda").quant is None  # a draft following a GPU target


def test_ids_are_ranked_by_their_counts_and_keyed_by_the_vocabulary():
    tok = char_tokenizer()
    ranked = rank_ids(tok, ["aaab", "ba", "c"])
    a, b, c = (tok.convert_tokens_to_ids(ch) for ch in "abc")
    assert ranked.tolist() == [a, b, c]  # 4 a's, 2 b's, 1 c; ids never seen are left out
    assert vocab_key(tok) == vocab_key(char_tokenizer())  # the content, not the object
    other = char_tokenizer()
    other.add_tokens(["<extra>"])
    assert vocab_key(other) != vocab_key(tok)


@pytest.mark.real_model
def test_the_embedded_default_ranks_its_own_tokenizer_from_the_shipped_text(tmp_path, monkeypatch):
    """The ranking made from shipped text for SmolLM2's own tokenizer puts common ids first (a space
    and 'the'-like pieces) and is kept in the cache by content: the second call reads it back."""
    from quickdraft.drafters.draft_models import ranking
    from quickdraft.weights.loading import load_model

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path))
    monkeypatch.setattr(ranking, "SOURCE_TOKENS", 100_000)
    tok = load_model(None).tokenizer
    ranked = ranking.ranked_for(tok)
    assert ranked.numel() > 1000 and len(set(ranked.tolist())) == ranked.numel()
    assert any(p.is_file() for p in (tmp_path / "vocab").rglob("*.safetensors"))
    monkeypatch.setattr(ranking, "_source_texts", lambda *a: pytest.fail("ranked again"))
    assert torch.equal(ranking.ranked_for(tok), ranked)


def test_the_one_call_api_keeps_its_engine_while_the_options_asked_do_not_change(tiny_model_dir):
    """The engine resolves auto (its config says what runs), but `generate()` keys the engine it keeps
    by the options as asked: a second call with the same ones does not load again; another one does."""
    from quickdraft import api, generate

    generate("abc", target=tiny_model_dir, max_new_tokens=4)
    first = api._LOADED[0]
    assert first.config.drafter != "auto" and first.requested.drafter == "auto"
    generate("abd", target=tiny_model_dir, max_new_tokens=4)
    assert api._LOADED[0] is first
    generate("abd", target=tiny_model_dir, drafter="ngram", max_new_tokens=4)
    assert api._LOADED[0] is not first
