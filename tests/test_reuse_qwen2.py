"""Draft modules (the feature head, Kangaroo, SpecDec) on a Qwen2 target (the 1.5B's family): the
module's own block is Llama's, started from the target's layer without its q/k/v biases, while the
target keeps them; each, trained briefly on the target's own text and stored as `train-draft` stores
it, drafts through the engine and gives plain decoding's tokens exactly."""

from __future__ import annotations

import pytest
import torch
from test_families import family_model

from quickdraft import Engine
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding import Generators, collect
from quickdraft.decoding.autoregressive import Autoregressive
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.settings.options import options_from
from quickdraft.training.train_draft_cli import export
from quickdraft.training.train_heads import Batch, HeadTrainingConfig, new_module, train_loss

from conftest import tiny_qwen2

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def target():
    return tiny_qwen2(vocab=48, layers=3, hidden=32, seed=5, dtype=torch.float64)


def plain(target, n: int) -> list[int]:
    decoder = Autoregressive(NativeCachedModel(target.model))
    return collect(decoder.rounds(PROMPT, GREEDY, n, Generators.from_seed(0)), StopConfig(n)).token_ids


def trained(kind: str, target, steps: int = 150):
    text = PROMPT + plain(target, 64)
    out = NativeCachedModel(target.model).forward(text, keep_hidden=(1,), features=True)
    batch = Batch(torch.tensor([text]), [len(text)], [len(PROMPT)], out.features[None].clone(), out.hidden[1][None])
    module = new_module(kind, target.model, HeadTrainingConfig(kinds=(kind,), exit_layer=1, block=3)).double()
    embed, head = target.model.model.embed_tokens.weight.detach(), target.model.lm_head.weight.detach()
    opt = torch.optim.Adam(module.parameters(), lr=3e-3)
    for _ in range(steps):
        loss, _ = train_loss(module, batch, embed, head, 1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module.eval().requires_grad_(False)


@pytest.mark.parametrize("kind", ["head", "kangaroo", "specdec"])
def test_a_module_drafts_for_a_qwen2_target_and_equals_plain_decoding(target, kind, tmp_path):
    meta = {"target": target.name, "exit_layer": 1, "block": 3}
    folder = export(tmp_path / kind, trained(kind, target, 400 if kind == "specdec" else 150), None, meta)
    engine = Engine(target, options_from({"method": "sd", "drafter": f"{kind}:{folder}", "guard": False}))
    out = engine.generate_ids(PROMPT, GREEDY, StopConfig(32))
    assert out.token_ids == plain(target, 32)
    assert out.stats.num_accepted_draft_tokens > 0 < out.stats.num_draft_tokens  # speculation happened


def test_a_family_whose_layers_are_not_llamas_is_still_refused(tmp_path):
    """Negative control: a Gemma 3 target (sandwich norms) keeps the refusal, with its reason."""
    gemma = family_model("gemma3", dtype=torch.float32)
    module = new_module("head", tiny_qwen2(vocab=64, layers=2, hidden=32).model, HeadTrainingConfig(kinds=("head",)))
    folder = export(tmp_path / "head", module, None, {"target": "x"})
    with pytest.raises(QuickdraftError, match="gemma3_text is not one|not one"):
        Engine(gemma, options_from({"method": "sd", "drafter": f"head:{folder}"}))
