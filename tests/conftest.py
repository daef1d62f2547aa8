"""Tiny in-process models for fast CPU tests (no downloads, no weights on disk unless a test saves them)."""

from __future__ import annotations

import copy
import functools
import string

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from quickdraft.runtime import kernels
from quickdraft.runtime.caches.cached_model import TokenCacheVerbs
from quickdraft.weights.loading import LoadedModel

CHARS = string.ascii_lowercase + " .,!?"


@pytest.fixture(autouse=True)
def _lookups_priced_at_zero(monkeypatch):
    """Tests pin what the cost model measures (curves through `cost_curve._MEMO`): a suffix drafter's
    lookups, timed on this host, would outweigh a tiny target's step and turn speculation off. A
    test of that pricing sets `SuffixDrafter.lookup_seconds` itself."""
    from quickdraft.costs import cost_curve
    from quickdraft.drafters.model_free.suffix import SuffixDrafter

    monkeypatch.setattr(SuffixDrafter, "lookup_seconds", lambda self: None)
    monkeypatch.setattr(cost_curve, "PERSIST_DRAFTING", False)  # nor are these prices kept in the cache


SPECIALS = ["<pad>", "<eos>", "<unk>"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ids 0..2 are <pad>, <eos>, <unk>, then one id per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_llama(
    vocab: int = 64,
    layers: int = 2,
    hidden: int = 32,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    init: float = 0.3,
    tokenizer: object | None = None,
    eos: int | None = None,
) -> LoadedModel:
    """A random Llama with peaky logits (large init) so greedy paths repeat and drafts get accepted."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=init,
        tie_word_embeddings=False,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = eos
    return LoadedModel(model=model, tokenizer=tokenizer, name=f"tiny-{seed}")


def tiny_qwen2(vocab: int = 64, layers: int = 2, hidden: int = 32, seed: int = 0, dtype=torch.float32) -> LoadedModel:
    """A random Qwen2 (a Llama block with q/k/v biases, drawn non-zero: its init zeroes them), untied head."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.3,
        tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.bias"):
                p.normal_(0, 0.3)
    model = model.to(dtype)
    model.generation_config.eos_token_id = None
    return LoadedModel(model=model, tokenizer=None, name=f"tiny-qwen2-{seed}")


def noisy_copy(target: LoadedModel, noise: float, seed: int = 1) -> LoadedModel:
    """A draft that agrees with the target part of the time: its weights plus Gaussian noise."""
    draft = copy.deepcopy(target.model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * noise * p.std().clamp_min(1e-3))
    return LoadedModel(model=draft, tokenizer=target.tokenizer, name=f"{target.name}-noisy{noise}")


# --- Markov-chain fakes: exact, enumerable laws for distribution tests ---------------------------


@functools.cache
def _row_index(token: int) -> torch.Tensor:
    """(1,) int64 index of one row, made once a process (read only: index_select never writes it)."""
    return torch.tensor([token])


class MarkovModel(TokenCacheVerbs):
    """A cache owner like CachedModel: the next-token logits depend only on the last token (log T[last])."""

    def __init__(self, transition: torch.Tensor) -> None:
        self.logT = transition.double().log()  # (V, V)
        self.vocab_size = transition.shape[0]
        self.max_length = 1 << 20
        self.tokens: list[int] = []
        self.num_forwards = 0

    @property
    def length(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        self.tokens = []

    def extend(self, tokens, last_only: bool = False) -> torch.Tensor:
        tokens = [int(t) for t in tokens]
        self.tokens.extend(tokens)
        self.num_forwards += 1
        if last_only or len(tokens) == 1:  # one row: its cached index (torch.tensor costs ~20 us a call)
            return self.logT.index_select(0, _row_index(tokens[-1]))
        return self.logT[torch.tensor(tokens)]

    def prefill(self, tokens) -> torch.Tensor:
        self.reset()
        return self.extend(tokens, last_only=True)

    def rollback(self, length: int) -> None:
        assert 0 <= length <= self.length
        del self.tokens[length:]

    def sync(self, context, last_only: bool = True) -> torch.Tensor:
        self.rollback(min(self.length, len(context) - 1))
        keep = 0
        while keep < self.length and self.tokens[keep] == context[keep]:
            keep += 1
        self.rollback(keep)
        return self.extend(context[keep:], last_only=last_only)


def random_transition(vocab: int, seed: int, concentration: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = -(torch.log(torch.rand(vocab, vocab, generator=g, dtype=torch.float64)) ** (1 / concentration))
    return t / t.sum(-1, keepdim=True)


@pytest.fixture
def tiny_target() -> LoadedModel:
    return tiny_llama(seed=0)


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}.{% endfor %}"


def tiny_text_model(
    seed: int = 0, dtype: torch.dtype = torch.float32, chat: bool = True, layers: int = 2
) -> LoadedModel:
    """A tiny model with the character tokenizer (eos id 1) so text prompts and stop strings work."""
    tok = char_tokenizer()
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tiny_llama(vocab=len(tok), layers=layers, seed=seed, dtype=dtype, tokenizer=tok, eos=tok.eos_token_id)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny text model saved as an ordinary Hugging Face folder (for CLI and bench tests)."""
    path = tmp_path_factory.mktemp("tiny-model")
    m = tiny_text_model()
    m.model.save_pretrained(path)
    m.tokenizer.save_pretrained(path)
    return str(path)


# an AVX-512-BF16 EPYC's measured verify-cost curve (issue #24; a 200-token cache)
FLAT_CURVE = {1: 1.0, 2: 1.03, 3: 1.08, 5: 1.14, 9: 1.12, 13: 1.38, 17: 1.68, 25: 1.8, 33: 1.85}


@pytest.fixture
def flat_costs(monkeypatch):
    """Pin the host's verify-cost curve and a lone row's batched cost surface to an AVX-512 host's
    flat ones, for tests of a lone request that assert speculation happened: a tiny target's forwards
    timed on a loaded CI machine can price every draft out (what the cost model decides from its
    measures is tested in test_cost_curve.py and test_batch.py)."""
    from quickdraft import engine
    from quickdraft.costs import cost_curve

    monkeypatch.setattr(cost_curve, "cost_curve", lambda *a, **k: dict(FLAT_CURVE))
    monkeypatch.setattr(engine, "batch_cost_surface", lambda *a, **k: {(1, w): v for w, v in FLAT_CURVE.items()})


# every instruction-set level this host runs (issue #47): the chosen one in the inner loop, the others
# built (about 30 s each) and checked in CI
LEVELS = kernels.supported_levels()


@pytest.fixture(params=[pytest.param(lv, marks=[pytest.mark.slow] if i else []) for i, lv in enumerate(LEVELS)])
def ops(request, monkeypatch):
    """One level's kernels, and every caller of `kernels.fused_ops()` given them (the linears, the forward)."""
    module = kernels.fused_ops(request.param)
    if module is None:
        pytest.skip(f"the {request.param} kernels could not be built here")
    monkeypatch.setattr(kernels, "fused_ops", lambda level=None: module if level is None else kernels._load(level))
    return module


def int8_rows(x: torch.Tensor) -> torch.Tensor:
    """(n, k) rows on the int8 kernels' activation grid, emulated: absmax / 127 per row and block of 32."""
    n, k = x.shape
    blocks = -(-k // 32)
    xf = F.pad(x.float(), (0, blocks * 32 - k)).view(n, blocks, 32)
    sx = xf.abs().amax(dim=-1, keepdim=True) / 127
    return (torch.round(xf / sx) * sx).view(n, blocks * 32)[:, :k]


def bench_one_prompt(tmp_path, methods: str, text: str, max_new_tokens: int, target: LoadedModel | None = None):
    """`run_bench` of `methods` on one prompt (`text`), one run, on `target` (default: the embedded
    default in bf16); its summary."""
    import json

    from quickdraft.bench.runner import BenchConfig, run_bench
    from quickdraft.weights.loading import load_model

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": "1", "category": "a", "turns": [text]}) + "\n")
    config = BenchConfig(methods=methods, prompts=str(prompts), max_new_tokens=max_new_tokens, runs=1)
    config.out = str(tmp_path / "out")
    return run_bench(config, target or load_model(None, "bfloat16"), progress=False)
