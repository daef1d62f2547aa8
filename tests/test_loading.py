"""Loading a model folder: its tokenizer parsed once a process while its files are unchanged, each
caller with its own copy; a truncated copy built without the random init its weights overwrite."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from quickdraft.weights import loading
from quickdraft.weights.loading import load_model, truncated_copy


def test_a_folders_tokenizer_is_parsed_once_while_its_files_are_unchanged(tiny_model_dir, monkeypatch):
    calls = []
    real = loading.AutoTokenizer.from_pretrained
    monkeypatch.setattr(loading, "_TOKENIZERS", {})
    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a) or real(*a, **k))
    a, b = load_model(str(tiny_model_dir), "float32"), load_model(str(tiny_model_dir), "float32")
    assert len(calls) == 1 and a.tokenizer is not b.tokenizer
    assert a.tokenizer.encode("abc") == b.tokenizer.encode("abc")
    a.tokenizer.chat_template = "{{ 'x' }}"  # a caller's change stays its own
    assert b.tokenizer.chat_template != "{{ 'x' }}"
    config = Path(tiny_model_dir) / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    load_model(str(tiny_model_dir), "float32")
    assert len(calls) == 2  # a changed file is parsed again
    load_model(str(tiny_model_dir), "float32")
    assert len(calls) == 2


def test_a_truncated_copy_equals_an_initialised_build(tiny_model_dir):
    """Skipping the init changes nothing a copy computes (its rotary tables are built, not initialised)."""
    target = load_model(str(tiny_model_dir), "float32")
    draft = truncated_copy(target, 1)
    config = copy.deepcopy(target.model.config)
    config.num_hidden_layers = 1
    ref = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    ref.load_state_dict(target.model.state_dict(), strict=False)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        got, want = draft.model.eval()(ids).logits, ref.eval()(ids).logits
        assert torch.equal(got, want)
        assert not torch.equal(got, target.model(ids).logits)  # the control: the whole target differs
