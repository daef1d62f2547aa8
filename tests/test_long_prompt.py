"""Issue #79 item 4: a long prompt's prefill on the lone path runs in chunks (`PREFILL_CHUNK` rows a
forward), so no attention mask is wider than a chunk's rows (a whole 15k-token prompt's was 15k x 15k,
about 225 MB): the same logits and cache as one forward (float64), and a generation after it equal to
plain decoding's with drafts accepted. The control: unchunked, the widest mask is the whole prompt's."""

from __future__ import annotations

import torch

from quickdraft.runtime.caches import native_cache
from quickdraft.runtime.caches.native_cache import NativeCachedModel

from conftest import tiny_llama


def _widest_mask(monkeypatch, model, prompt) -> tuple[torch.Tensor, int]:
    """The prompt's logits through a NativeCachedModel, and the most rows any one forward ran."""
    cached = NativeCachedModel(model)
    widths = []
    real = cached.net.forward

    def spy(cache, at, ids=None, **kw):
        widths.append(ids.shape[0])
        return real(cache, at, ids, **kw)

    monkeypatch.setattr(cached.net, "forward", spy)
    logits = cached.extend(prompt)
    logits = torch.cat([logits, cached.extend([3])])  # one more token over the chunked cache
    return logits, max(widths)


def test_a_long_prefill_runs_in_chunks_with_the_same_logits(monkeypatch):
    model = tiny_llama(vocab=64, layers=2, hidden=32, seed=5, dtype=torch.float64).model
    prompt = [int(t) for t in torch.randint(0, 64, (45,), generator=torch.Generator().manual_seed(1))]
    whole, widest = _widest_mask(monkeypatch, model, prompt)
    assert widest == 45  # control: one forward over the whole prompt
    monkeypatch.setattr(native_cache, "PREFILL_CHUNK", 16)
    chunked, widest = _widest_mask(monkeypatch, model, prompt)
    assert widest == 16
    torch.testing.assert_close(chunked, whole, atol=1e-10, rtol=0)


def test_speculation_after_a_chunked_prefill_equals_plain_decoding(monkeypatch, flat_costs):
    from quickdraft.engine import Engine
    from quickdraft.settings.options import EngineConfig, options_from

    monkeypatch.setattr(native_cache, "PREFILL_CHUNK", 8)
    target = tiny_llama(vocab=64, layers=2, hidden=32, seed=6, dtype=torch.float64)
    prompt = [5, 6, 7, 8] * 10  # 40 tokens: five chunks
    ar = Engine(target, EngineConfig(method="ar")).generate(prompt, max_new_tokens=24)
    sd = Engine(target, options_from({"drafter": "ngram:2:1", "draft_length": 4, "guard": False}))
    out = sd.generate(prompt, max_new_tokens=24)
    assert out.token_ids == ar.token_ids and out.stats.num_draft_tokens > 0


def test_the_peers_context_is_sized_to_the_prompts():
    """`peer_context` capped a peer at 4,096 positions, so an 8k-31k-token prompt could not run there."""
    from quickdraft.bench.peers import gguf_peer

    target = tiny_llama()  # max_position_embeddings 4096
    target.model.config.max_position_embeddings = 32768
    assert gguf_peer.peer_context(target) == 4096
    with gguf_peer.sized_for(31128):
        assert gguf_peer.peer_context(target) == 31128
    with gguf_peer.sized_for(40000):
        assert gguf_peer.peer_context(target) == 32768  # never beyond the model's window
    assert gguf_peer.peer_context(target) == 4096
