"""The described block (runtime/forward/families.py) per decoder family: a tiny random config of each, made
here (no download), gives Hugging Face's logits to 1e-10 in float64 through the native forward
(prefill, steps, a token tree, sliding windows crossed), and speculative decoding through it equals
plain decoding exactly (suffix, n-gram and a truncated self-draft)."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from quickdraft import Engine, EngineConfig
from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.forward.families import unsupported_reason
from quickdraft.settings.options import options_from
from quickdraft.weights.loading import LoadedModel

SHAPE = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.3, tie_word_embeddings=False,
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)  # fmt: skip
WINDOW = 5  # sliding windows short enough for the tests' sequences to cross them
LONG_FROM = 16  # longrope's original_max_position_embeddings: the long factors from position 16

FAMILIES = {
    "llama3-rope": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            )
        ),  # fmt: skip
    ),
    "llama-yarn": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16)
        ),
    ),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict()),  # q/k/v biases
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=8)),  # q/k norms
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=WINDOW, head_dim=8)),
    "phi3": (Phi3Config, Phi3ForCausalLM, dict()),  # fused q/k/v and gate/up
    "phi3-longrope": (  # short factors up to position 15, long ones from 16 (the tests cross it)
        Phi3Config,
        Phi3ForCausalLM,
        dict(
            max_position_embeddings=64,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                short_factor=[1.0, 1.1, 1.2, 1.3],
                long_factor=[2.0, 3.0, 4.0, 5.0],
                original_max_position_embeddings=LONG_FROM,
            ),
        ),  # fmt: skip
    ),
    "gemma2": (  # soft-capped attention scores and final logits, alternating sliding layers
        Gemma2Config,
        Gemma2ForCausalLM,
        dict(
            head_dim=8,
            query_pre_attn_scalar=12,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),  # fmt: skip
    ),
    "gemma3": (
        Gemma3TextConfig,
        Gemma3ForCausalLM,
        dict(
            head_dim=8,
            query_pre_attn_scalar=12,
            sliding_window=WINDOW,
            tie_word_embeddings=True,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        ),  # fmt: skip
    ),
}


def family_model(name: str, seed: int = 0, dtype=torch.float64) -> LoadedModel:
    config_type, model_type, extra = FAMILIES[name]
    torch.manual_seed(seed)
    config = config_type(**{**SHAPE, **extra})
    model = model_type(config).to(dtype).eval()
    with torch.no_grad():  # Gemma's norms start at zero (weight 1 + 0): make them matter
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0.0, 0.3)
    model.generation_config.eos_token_id = None
    return LoadedModel(model=model, tokenizer=None, name=f"tiny-{name}")


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0]


def close(a, b, tol: float = 1e-10) -> bool:
    return (a.double() - b.double()).abs().max().item() <= tol


@pytest.mark.parametrize("name", list(FAMILIES))
def test_native_forward_equals_hugging_face(name):
    model = family_model(name).model
    assert unsupported_reason(model) is None
    nat = NativeCachedModel(model)
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]  # longer than the sliding window
    assert close(nat.prefill(seq)[-1], hf_logits(model, seq)[-1])
    assert close(nat.extend([8]), hf_logits(model, seq + [8])[-1:])
    assert close(nat.extend([9, 7]), hf_logits(model, seq + [8, 9, 7])[-2:])
    nat.rollback(len(seq))
    tokens, depth = [11, 12, 13], [0, 1, 1]  # a tree: 11 -> {12, 13}
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    got = nat.extend(tokens, positions=[len(seq) + d for d in depth], tree_mask=mask)
    # Soft-capped scores (Gemma 2) take their softmax in float32, as Hugging Face's eager path: a tree row
    # with a masked key sums its exponentials in other float32 lanes than the path without it (on AVX2's
    # 8 lanes, not AVX-512's 16), so it agrees to float32's precision there, not to float64's
    tree_tol = 1e-5 if getattr(model.config, "attn_logit_softcapping", None) else 1e-10
    for i, path in enumerate(([11], [11, 12], [11, 13])):
        assert close(got[i], hf_logits(model, seq + path)[-1], tree_tol), f"tree row {i}"


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("drafter", ["suffix:none", "ngram", "truncated:1"])
def test_speculative_decoding_through_the_native_forward_equals_plain(name, drafter):
    target = family_model(name, seed=1)
    config = options_from(
        {"method": "sd", "drafter": drafter, "draft_length": 3, "runtime": "native"}
    )  # no auto sizing
    sd = Engine(target, config)
    ar = Engine(target, EngineConfig(method="ar", runtime="hf"))
    assert type(sd.target).__name__ == "NativeCachedModel"
    drafted = 0
    for prompt in ([5, 6, 7, 5, 6, 7], [9, 9, 9, 9]):
        a = ar.generate_ids(prompt, SamplingConfig(), StopConfig(24))
        b = sd.generate_ids(prompt, SamplingConfig(), StopConfig(24))
        assert b.token_ids == a.token_ids
        drafted += b.stats.num_draft_tokens
    assert drafted > 0  # speculation happened


def test_longrope_switches_factors_by_position_as_decoding_one_token_at_a_time():
    """Phi-3's longrope natively: a prefill and a tree across position 16 give the logits of
    Hugging Face's forward fed one token at a time (short factors before, long ones from there)."""
    model = family_model("phi3-longrope").model
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]  # positions 0..19
    cache, steps = None, []
    with torch.no_grad():
        for i, t in enumerate(seq):
            out = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True, position_ids=torch.tensor([[i]]))
            cache = out.past_key_values
            steps.append(out.logits[0, -1])
    nat = NativeCachedModel(model)
    assert close(nat.prefill(seq[:14])[-1], steps[13])
    assert close(nat.extend(seq[14:]), torch.stack(steps[14:]))
    assert not close(NativeCachedModel(family_model("phi3").model).prefill(seq)[-1], steps[-1])  # it mattered


def test_an_architecture_the_block_cannot_express_falls_back_with_a_reason():
    """Dynamic NTK scaling changes its frequencies with the sequence length: Hugging Face's forward
    runs, and the runtime says why in one line."""
    torch.manual_seed(0)
    rope = dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)
    model = LlamaForCausalLM(LlamaConfig(**{**SHAPE, "rope_parameters": rope})).eval()
    reason = unsupported_reason(model)
    assert reason is not None and "dynamic" in reason and "\n" not in reason
    engine = Engine(LoadedModel(model=model, tokenizer=None, name="tiny-dynamic"), EngineConfig(method="ar"))
    assert type(engine.target).__name__ == "CachedModel"


@pytest.mark.parametrize("name", ["gemma3", "gemma2", "mistral", "qwen3"])
def test_windowed_and_capped_families_batch(name):
    """The batched forward narrows each sliding-window layer's mask per row (prompts and outputs
    run well past the window of 5) and caps Gemma 2's scores over the batch, chains and suffix trees
    alike: each output in a batch is what its prompt gives alone."""
    engine = Engine(family_model(name, seed=2), EngineConfig(method="ar"))
    assert engine.batch_unsupported() is None
    prompts = [[5, 6, 7], [9, 9, 9, 9, 3, 4, 5, 6, 9, 9], [11, 12]]
    together = engine.generate(prompts, max_new_tokens=12)
    alone = [engine.generate(p, max_new_tokens=12) for p in prompts]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert all(r.stats.extra.get("batch_rows") for r in together)
    # speculation in the batch: tree rows at depth positions under the window and the caps
    sd = Engine(family_model(name, seed=2), EngineConfig(drafter="suffix:none", draft=DraftConfig(guard=False)))
    drafted = sd.generate(prompts, max_new_tokens=12)
    assert [r.token_ids for r in drafted] == [r.token_ids for r in alone]
    assert sum(r.stats.num_draft_tokens for r in drafted) > 0 and drafted[0].stats.extra.get("batch_rows")


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "qwen2", "phi3", "mistral"])
def test_described_blocks_run_the_fused_kernels_batch_invariantly(name, monkeypatch):
    """Over one sequence a described block runs the fused kernels (Gemma's 1 + w norms folded into
    the RMSNorm kernel, per-head q/k norms, biases, the attention scale, sandwich norms, GeGLU): in
    float32 its logits stay close to Hugging Face's, and in bf16 a 5-row forward (a verify) equals
    five one-row steps bit for bit, so greedy speculation equals plain decoding exactly in bf16."""
    from quickdraft.runtime import kernels
    from quickdraft.runtime.forward.llama_block import Block

    if kernels.fused_ops() is None:
        pytest.skip("no fused kernels on this host")
    calls = []
    fused = Block._fused_forward
    monkeypatch.setattr(Block, "_fused_forward", lambda self, *a: calls.append(1) or fused(self, *a))
    seq, more = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [8, 9, 7, 9, 3]
    model = family_model(name, dtype=torch.float32).model
    got, want = NativeCachedModel(model).prefill(seq)[-1], hf_logits(model, seq)[-1]
    assert calls and (got - want).abs().max() <= 1e-4 * want.abs().max()
    model = family_model(name, dtype=torch.bfloat16).model
    wide, steps = NativeCachedModel(model), NativeCachedModel(model)
    wide.prefill(seq)
    steps.prefill(seq)
    rows = wide.extend(more)
    assert torch.equal(rows, torch.cat([steps.extend([t]) for t in more]))
    ar = Engine(LoadedModel(model, None, name), EngineConfig(method="ar", dtype="bfloat16"))
    sd = Engine(LoadedModel(model, None, name), options_from({"drafter": "suffix:none", "guard": False}))
    for prompt in ([5, 6, 7, 5, 6, 7], [9, 9, 9, 9]):
        a, b = (e.generate_ids(prompt, SamplingConfig(), StopConfig(24)) for e in (ar, sd))
        assert b.token_ids == a.token_ids and b.stats.num_draft_tokens > 0
