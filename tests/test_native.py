"""The native runtime equals Hugging Face's forward: logits for prefill, steps, multi-token extends,
rollbacks and tree-masked extends (1e-10 in float64, 1e-4 in float32), hidden states, layer ranges,
compaction; on random Llama configs (GQA, tied and untied heads, odd sizes) and the default model."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from quickdraft import Engine, EngineConfig
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.choose import cached_model

from conftest import tiny_llama

CONFIGS = {
    "gqa-untied": dict(
        vocab_size=37,
        hidden_size=40,
        intermediate_size=52,
        num_hidden_layers=3,
        num_attention_heads=5,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    ),
    "mha-tied": dict(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    ),
    "odd-head-dim": dict(
        vocab_size=29,
        hidden_size=36,
        intermediate_size=20,
        num_hidden_layers=4,
        num_attention_heads=3,
        num_key_value_heads=3,
        head_dim=10,
        tie_word_embeddings=False,
        rope_theta=5000.0,
    ),
}
TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def random_llama(name: str, dtype: torch.dtype, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(**CONFIGS[name], max_position_embeddings=256, initializer_range=0.2)
    return LlamaForCausalLM(cfg).to(dtype).eval()


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """Reference: one uncached Hugging Face forward over the whole sequence: (len, V)."""
    return model(torch.tensor([ids])).logits[0]


def close(a, b, dtype) -> bool:
    return (a.double() - b.double()).abs().max().item() <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_steps_extends_and_rollbacks_match_hf(name, dtype):
    model = random_llama(name, dtype)
    nat = NativeCachedModel(model)
    seq = [3, 1, 4, 1, 5, 9, 2, 6]
    assert close(nat.prefill(seq)[-1], hf_logits(model, seq)[-1], dtype)
    for new in ([5], [3, 5, 8], [9], [7, 9, 3, 2, 3]):  # one-token steps and multi-token extends
        got = nat.extend(new)
        seq += new
        assert close(got, hf_logits(model, seq)[-len(new) :], dtype)
    nat.rollback(10)  # drop the tail, then continue differently
    seq = seq[:10] + [8, 4]
    assert close(nat.extend([8, 4]), hf_logits(model, seq)[-2:], dtype)
    assert nat.length == len(seq) == len(nat.tokens)


def test_rollback_moves_no_data_and_extends_reuse_the_cache():
    nat = NativeCachedModel(random_llama("gqa-untied", torch.float32))
    nat.prefill(list(range(20)))
    k_ptr, v_ptr = nat.cache.k.data_ptr(), nat.cache.v.data_ptr()
    for _ in range(10):
        nat.extend([1, 2, 3])
        nat.rollback(nat.length - 2)
    assert (nat.cache.k.data_ptr(), nat.cache.v.data_ptr()) == (k_ptr, v_ptr)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tree_masked_extend_gives_each_row_the_logits_of_its_own_path(dtype):
    """A token tree in one call: row i sees the context and its ancestors only, at depth positions."""
    model = random_llama("gqa-untied", dtype)
    nat = NativeCachedModel(model)
    context = [2, 7, 1, 8, 2, 8]
    nat.prefill(context)
    #        0     1     2     3     4
    tokens = [11, 12, 13, 14, 15]
    parent = [-1, 0, 0, 1, 2]  # 0 -> {1, 2}, 1 -> 3, 2 -> 4
    depth = [0, 1, 1, 2, 2]
    mask = torch.zeros(5, 5, dtype=torch.bool)
    for i in range(5):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    positions = [len(context) + d for d in depth]
    got = nat.extend(tokens, positions=positions, tree_mask=mask)
    for i in range(5):
        path, j = [], i
        while j >= 0:
            path.insert(0, tokens[j])
            j = parent[j]
        assert close(got[i], hf_logits(model, context + path)[-1], dtype), f"row {i}"
    nat.compact([0, 2, 4])  # keep the path 11 -> 13 -> 15
    assert nat.tokens == context + [11, 13, 15]
    assert close(nat.extend([16]), hf_logits(model, context + [11, 13, 15, 16])[-1:], dtype)


def test_compact_after_the_cache_grew():
    """A long context grows the cache inside inference mode; compacting it later must still work."""
    model = random_llama("gqa-untied", torch.float64)
    nat = NativeCachedModel(model)
    nat.cache = nat.net.new_cache(capacity=8)  # force growth
    context = [i % 30 for i in range(40)]
    nat.prefill(context)
    assert nat.cache.capacity >= 40
    mask = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])  # 1 -> {2, 3}
    nat.extend([1, 2, 3], positions=[40, 41, 41], tree_mask=mask)
    nat.compact([0, 2])  # keep the path 1 -> 3
    assert close(nat.extend([4]), hf_logits(model, context + [1, 3, 4])[-1:], torch.float64)


def test_hidden_states_and_layer_ranges_match_hf():
    model = random_llama("odd-head-dim", torch.float64)
    nat = NativeCachedModel(model)
    ids = [1, 2, 3, 4, 5, 6]
    with torch.no_grad():
        ref = model(torch.tensor([ids]), output_hidden_states=True).hidden_states  # (L + 1) x (1, n, H)
    layers = nat.net.num_layers
    out = nat.forward(ids, keep_hidden=range(layers + 1), features=True)  # one record: logits and states
    for i in range(layers):  # HF's last entry is after the final norm; ours at num_layers is before it
        assert close(out.hidden[i], ref[i][0], torch.float64), f"layer {i}"
    assert close(nat.net.rms_norm(out.hidden[layers], nat.net.norm), ref[layers][0], torch.float64)
    assert close(out.features, ref[layers][0], torch.float64)  # the final-normed rows the head reads
    assert not hasattr(nat, "hidden") and not hasattr(nat, "features")  # the owner keeps only its cache
    # run layers [2, L) alone from the state entering layer 2: the same final states
    cache = nat.net.new_cache()
    nat.net.forward(cache, 0, torch.tensor(ids), layers=(0, 2))
    out, _ = nat.net.forward(cache, 0, hidden=out.hidden[2], layers=(2, layers))
    assert close(out, ref[layers][0], torch.float64)


def test_restricted_head_and_padded_vocabulary():
    model = random_llama("mha-tied", torch.float64)
    ids = torch.tensor([0, 5, 7, 30])
    nat = NativeCachedModel(model, vocab_size=40, head_ids=ids)
    logits = nat.prefill([1, 2, 3])[-1]
    ref = hf_logits(model, [1, 2, 3])[-1]
    assert logits.shape == (40,) and torch.isinf(logits[1]) and close(logits[ids], ref[ids], torch.float64)


@pytest.mark.parametrize("runtime", ["native", "hf"])
def test_greedy_speculative_decoding_equals_plain_decoding_on_both_runtimes(runtime):
    target = tiny_llama(vocab=64, layers=3, seed=2, dtype=torch.float64)
    cfg = EngineConfig(method="sd", drafter="truncated:1", runtime=runtime)
    sd = Engine(target, cfg)
    ar = Engine(target, EngineConfig(method="ar", runtime="hf"))
    assert type(sd.target).__name__ == ("NativeCachedModel" if runtime == "native" else "CachedModel")
    for prompt in ([5, 6, 7], [9, 9, 9, 9], [1]):
        a = ar.generate_ids(prompt, SamplingConfig(), StopConfig(40))
        b = sd.generate_ids(prompt, SamplingConfig(), StopConfig(40))
        assert b.token_ids == a.token_ids and b.stats.num_draft_tokens > 0


def test_runtime_choice_and_refusals():
    model = tiny_llama().model
    assert isinstance(cached_model(model), NativeCachedModel)
    assert not isinstance(cached_model(model, runtime="hf"), NativeCachedModel)
    model.config.model_type = "falcon"  # as if an architecture the described block does not cover
    assert not isinstance(cached_model(model), NativeCachedModel)  # auto falls back to HF's forward
    with pytest.raises(QuickdraftError, match="native does not support"):
        cached_model(model, runtime="native")
    with pytest.raises(QuickdraftError, match="runtime"):
        EngineConfig(runtime="fast")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_device_cuda_without_cuda_exits_2_with_one_line(tmp_path):
    exe = str(Path(sys.executable).with_name("quickdraft"))
    proc = subprocess.run([exe, "generate", "hi", "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no CUDA device" in proc.stderr


@pytest.mark.real_model
def test_default_model_native_equals_hf():
    from quickdraft.weights.loading import load_model

    m = load_model(None, "float64")
    nat = NativeCachedModel(m.model, m.vocab_size)
    seq = list(range(100, 140))
    assert close(nat.prefill(seq)[-1], hf_logits(m.model, seq)[-1, : m.vocab_size], torch.float64)
    got = nat.extend([5, 6, 7])
    assert close(got, hf_logits(m.model, seq + [5, 6, 7])[-3:, : m.vocab_size], torch.float64)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--device", "cuda"],
        ["serve", "--device", "cuda"],
        ["distill", "--output", "x", "--device", "cuda"],
        ["distill-eval", "--drafter", "ngram", "--device", "cuda"],
    ],
)
def test_every_command_refuses_cuda_without_cuda(argv, capsys, tmp_path, monkeypatch):
    from quickdraft.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert "no CUDA device" in capsys.readouterr().err
