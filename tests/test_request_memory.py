"""Memory per request (issue #80): every generation reports the most KV cache bytes it held (`SpecStats.
kv_cache_bytes`: the target's positions times its bytes a position, plus a draft model's own cache), on the
lone path, the batched path and the server (`metrics.speculative_decoding.kv_cache_bytes`, and the
`quickdraft:request_kv_cache_bytes` histogram). Controls: a longer generation holds more, a model-free
drafter adds nothing, a draft model adds its cache."""

from __future__ import annotations

import torch
from fastapi.testclient import TestClient

from quickdraft import Engine, EngineConfig
from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.drafters import ModelDrafter
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.runtime.caches.kv_cache import kv_bytes_per_token
from quickdraft.server.app import create_app

from conftest import noisy_copy, tiny_text_model

PROMPT = [5, 9, 3, 7, 11, 2, 8]


def per_position(model) -> int:
    """A position's bytes counted from a real cache: run one token and add up the layers' key and value tensors."""
    cache = CachedModel(model)
    cache.prefill([1])
    return sum(t.numel() * t.element_size() for layer in cache.cache.layers for t in (layer.keys, layer.values))


def test_bytes_a_position_are_what_a_real_cache_holds():
    target = tiny_text_model(dtype=torch.float32)
    assert kv_bytes_per_token(target.model) == per_position(target.model) > 0
    half = tiny_text_model(dtype=torch.bfloat16)
    assert kv_bytes_per_token(half.model) == per_position(half.model) == kv_bytes_per_token(target.model) // 2


def test_a_lone_generation_reports_the_cache_it_held():
    target = tiny_text_model(dtype=torch.float32)
    engine = Engine(target, EngineConfig(method="ar"))
    per = kv_bytes_per_token(target.model)
    short = engine.generate_ids(PROMPT, SamplingConfig(temperature=0), StopConfig(max_new_tokens=4, eos_token_ids=()))
    long = engine.generate_ids(PROMPT, SamplingConfig(temperature=0), StopConfig(max_new_tokens=12, eos_token_ids=()))
    # the last token is never fed: the cache holds the prompt and all but the last new token
    assert short.stats.kv_cache_bytes == (len(PROMPT) + 4 - 1) * per
    assert long.stats.kv_cache_bytes == (len(PROMPT) + 12 - 1) * per > short.stats.kv_cache_bytes


def test_a_draft_model_adds_its_cache_and_a_model_free_drafter_nothing():
    target = tiny_text_model(dtype=torch.float32)
    stop, greedy = StopConfig(max_new_tokens=10, eos_token_ids=()), SamplingConfig(temperature=0)
    config = EngineConfig(method="sd", draft=DraftConfig(guard=False))
    alone = Engine(target, EngineConfig(method="ar")).generate_ids(PROMPT, greedy, stop)
    suffix = Engine(target, EngineConfig(method="sd", drafter="suffix", draft=DraftConfig(guard=False)))
    drafted = Engine(target, config, drafter=ModelDrafter(CachedModel(noisy_copy(target, 0.2).model)))
    with_suffix, with_model = suffix.generate_ids(PROMPT, greedy, stop), drafted.generate_ids(PROMPT, greedy, stop)
    assert with_model.stats.num_draft_tokens > 0  # speculation happened
    per = kv_bytes_per_token(target.model)
    assert with_suffix.stats.kv_cache_bytes <= (len(PROMPT) + 10) * per  # the target's alone
    assert with_model.stats.kv_cache_bytes > alone.stats.kv_cache_bytes + len(PROMPT) * per  # the draft's too


def test_a_batched_request_reports_its_own_row():
    target = tiny_text_model(dtype=torch.float32)
    engine = Engine(target, EngineConfig(method="ar"))
    stop = StopConfig(max_new_tokens=6, eos_token_ids=())
    short, long = engine.generate_batch([PROMPT, PROMPT * 3], SamplingConfig(temperature=0), stop, max_batch=2)
    per = kv_bytes_per_token(target.model)
    assert short.stats.kv_cache_bytes == (len(PROMPT) + 6 - 1) * per
    assert long.stats.kv_cache_bytes == (3 * len(PROMPT) + 6 - 1) * per  # its own row, not the batch's


def test_the_server_reports_a_requests_cache_and_counts_it():
    target = tiny_text_model(dtype=torch.float32)
    engine = Engine(target, EngineConfig(method="ar"))
    with TestClient(create_app(lambda: engine, "tiny", max_queue=2, default_max_tokens=8)) as client:
        for _ in range(200):
            if client.get("/health").status_code == 200:
                break
        body = {"model": "tiny", "prompt": "abc", "max_tokens": 8, "temperature": 0, "return_spec_stats": True}
        got = client.post("/v1/completions", json=body).json()
        metrics = client.get("/metrics").text
    held = got["metrics"]["speculative_decoding"]["kv_cache_bytes"]
    assert held == (got["usage"]["prompt_tokens"] + got["usage"]["completion_tokens"] - 1) * kv_bytes_per_token(
        target.model
    )
    assert "quickdraft:request_kv_cache_bytes_count 1.0" in metrics
