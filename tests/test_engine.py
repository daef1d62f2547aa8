"""The Python API end to end on tiny text models: prompts, chat messages, stop strings, validation."""

import pytest
import torch

from quickdraft import Engine, EngineConfig, QuickdraftError
from quickdraft.drafters import ModelDrafter, make_drafter
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.weights.loading import check_vocab

from conftest import char_tokenizer, noisy_copy, tiny_llama, tiny_text_model


def engines(target, drafter=None):
    ar = Engine(target, EngineConfig(method="ar"))
    sd = Engine(
        target, EngineConfig(method="sd"), drafter=drafter or ModelDrafter(CachedModel(noisy_copy(target, 0.2).model))
    )
    return ar, sd


def test_text_prompt_greedy_sd_equals_ar_and_reports_stats():
    target = tiny_text_model(dtype=torch.float64)
    ar, sd = engines(target)
    a = ar.generate("hello world", max_new_tokens=30)
    b = sd.generate("hello world", max_new_tokens=30)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert b.stats.num_draft_tokens > 0
    assert a.stats.mean_acceptance_length == 1.0 and a.stats.num_target_forwards == a.stats.num_new_tokens


def test_list_of_prompts_and_chat_messages():
    target = tiny_text_model()
    ar, sd = engines(target)
    outs = sd.generate(["abc", "xyz"], max_new_tokens=5)
    assert isinstance(outs, list) and len(outs) == 2
    msgs = [{"role": "user", "content": "abc"}]
    assert sd.encode(msgs) == sd.encode("abc")  # a string prompt goes through the chat template
    assert sd.encode("abc", raw=True) != sd.encode("abc")
    assert sd.generate(msgs, max_new_tokens=5).token_ids == ar.generate(msgs, max_new_tokens=5).token_ids


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_stop_string_cuts_text_and_counts(method):
    target = tiny_text_model(dtype=torch.float64)
    ar, sd = engines(target)
    full = ar.generate("hello", max_new_tokens=40)
    assert len(full.text) > 6
    stop = full.text[4:6]  # a two-character stop string (two tokens, likely inside one accepted block)
    eng = ar if method == "ar" else sd
    out = eng.generate("hello", max_new_tokens=40, stop=[stop])
    cut = full.text.find(stop)
    assert out.text == full.text[:cut]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[: cut + len(stop)]
    assert out.stats.num_new_tokens == len(out.token_ids)


def test_sampling_with_seed_is_reproducible_through_the_api():
    target = tiny_text_model()
    _, sd = engines(target)
    a = sd.generate("abc", max_new_tokens=20, temperature=0.9, top_p=0.95, seed=5)
    b = sd.generate("abc", max_new_tokens=20, temperature=0.9, top_p=0.95, seed=5)
    assert a.token_ids == b.token_ids and a.stats.num_draft_tokens > 0


def test_bad_requests_are_clear_errors():
    target = tiny_text_model()
    _, sd = engines(target)
    with pytest.raises(QuickdraftError, match="empty"):
        sd.generate("")
    with pytest.raises(QuickdraftError, match="outside the vocabulary"):
        sd.generate([1, 2, 999])
    with pytest.raises(QuickdraftError, match="context length of 4096"):
        sd.generate("abc", max_new_tokens=5000)
    with pytest.raises(QuickdraftError, match="max_new_tokens"):
        sd.generate("abc", max_new_tokens=0)
    with pytest.raises(QuickdraftError, match="unknown method"):
        EngineConfig(method="medusa")
    assert sd.generate("abc", max_new_tokens=3).stats.num_new_tokens == 3  # still healthy


def test_vocab_mismatch_is_refused_before_generation():
    target = tiny_text_model()
    other = tiny_llama(vocab=target.vocab_size + 10)
    with pytest.raises(QuickdraftError, match="output tokens"):
        check_vocab(tiny_llama(vocab=34), other)
    changed = tiny_text_model()
    changed.tokenizer = char_tokenizer()
    changed.tokenizer.add_tokens(["<extra>"])
    with pytest.raises(QuickdraftError, match="do not share a vocabulary"):
        check_vocab(target, changed)


def test_padded_vocab_tail_is_accepted():
    target = tiny_text_model()
    padded = tiny_llama(vocab=target.vocab_size + 6, tokenizer=target.tokenizer)
    assert check_vocab(target, padded) == target.vocab_size
    sd = Engine(target, EngineConfig(method="sd"), drafter=ModelDrafter(CachedModel(padded.model, target.vocab_size)))
    assert sd.generate("abc", max_new_tokens=8).stats.num_draft_tokens > 0


def test_truncated_drafter_from_spec():
    target = tiny_llama(layers=3)
    drafter = make_drafter("truncated:1", target)
    assert drafter.model.model.config.num_hidden_layers == 1
    with pytest.raises(QuickdraftError):
        make_drafter("truncated:3", target)
    with pytest.raises(QuickdraftError):
        make_drafter("truncated:x", target)


def test_a_copied_draft_can_run_in_its_own_dtype():
    from quickdraft.config import SamplingConfig, StopConfig

    target = tiny_text_model(dtype=torch.float32)
    assert make_drafter("truncated:1", target).model.model.dtype == torch.float32  # the target's by default
    drafter = make_drafter("truncated:1@float64", target)
    assert drafter.model.model.dtype == torch.float64
    # greedy SD with a draft in another precision still equals plain decoding, and it speculated
    stop = StopConfig(20, target.eos_token_ids)
    ids = target.tokenizer("abc de")["input_ids"]
    ar = Engine(target, EngineConfig(method="ar")).generate_ids(ids, SamplingConfig(), stop)
    sd = Engine(target, EngineConfig(method="sd", drafter="truncated:1@float64")).generate_ids(
        ids, SamplingConfig(), stop
    )
    assert sd.token_ids == ar.token_ids and sd.stats.num_draft_tokens > 0
    for bad, msg in (("truncated:1@float8", "unknown dtype"), ("ngram@float32", "no dtype")):
        with pytest.raises(QuickdraftError, match=msg):
            make_drafter(bad, target)


@pytest.mark.parametrize("runtime", ["hf", "native"])
def test_a_draft_narrower_than_a_padded_target_vocabulary_drafts_and_stays_exact(runtime):
    """llama.cpp's converter pads a GGUF's vocabulary with `[PAD<id>]` tokens up to its embedding rows (a
    Qwen2.5 7B's 152,064 against its 0.5B's 151,936): the unpadded draft pairs with it, proposes none of
    the padding ids (its head restricted to its own rows), and greedy output equals plain decoding, with
    speculation. Control: an extra token that is not padding is still refused."""
    from quickdraft.config import SamplingConfig, StopConfig
    from quickdraft.drafters.draft_models.model_drafter import model_drafter

    tok = char_tokenizer()
    real = len(tok)
    tok.add_tokens([f"[PAD{i}]" for i in range(real, real + 3)])
    target = tiny_llama(vocab=len(tok), tokenizer=tok, eos=tok.eos_token_id)
    draft = tiny_text_model(seed=0)
    assert check_vocab(target, draft) == real + 3
    sd = Engine(target, EngineConfig(method="sd"), drafter=model_drafter(draft, target, "draft", runtime))
    ar = Engine(target, EngineConfig(method="ar"))
    drafted = 0
    for prompt in ([5, 6, 7], [9, 9, 4, 3], [20, 21]):
        a = ar.generate_ids(prompt, SamplingConfig(), StopConfig(24))
        b = sd.generate_ids(prompt, SamplingConfig(), StopConfig(24))
        assert b.token_ids == a.token_ids
        drafted += b.stats.num_draft_tokens
    assert drafted > 0
    other = char_tokenizer()
    other.add_tokens([f"[PAD{real}]", "<extra>", f"[PAD{real + 2}]"])
    with pytest.raises(QuickdraftError, match="do not share a vocabulary"):
        check_vocab(tiny_llama(vocab=len(other), tokenizer=other), draft)
