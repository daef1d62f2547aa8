"""Incremental detokenization equals the naive full decode at every step, on tricky tokenizations,
and the collector's stop strings and streamed text agree with the naive rules."""

import random

import pytest

from quickdraft.config import StopConfig
from quickdraft.decoding.collect import Collector
from quickdraft.prompts import IncrementalDetokenizer
from quickdraft.types import Round

from conftest import char_tokenizer


def _byte_level_tokenizer():
    """A byte-level BPE tokenizer trained here on multi-byte text (no download): characters such as
    'é', '日' and emoji split into several tokens, exactly the case incremental decoding gets wrong."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["héllo wörld 日本語 テキスト 👋🏽 café naïve", "the cat sat on the mat", "déjà vu 🙂 ok"] * 20
    tok.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok)


TEXTS = ["héllo wörld 日本語 👋🏽 café", "the cat 🙂 sat déjà vu", "テキスト naïve ok 日本"]


@pytest.fixture(scope="module", params=["byte-level", "char"])
def tokenizer(request):
    return _byte_level_tokenizer() if request.param == "byte-level" else char_tokenizer()


def _decode(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def _token_ids(tok, text):
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids
    return ids


def test_incremental_text_equals_the_naive_decode_at_every_step(tokenizer):
    decode = _decode(tokenizer)
    for text in TEXTS:
        ids = _token_ids(tokenizer, text if tokenizer.vocab_size > 100 else text.encode("ascii", "ignore").decode())
        detok = IncrementalDetokenizer(decode)
        for i, t in enumerate(ids):
            assert detok.add([t]) == decode(ids[: i + 1])
        assert detok.text == decode(ids)


def test_multibyte_characters_really_split_across_tokens():
    tok = _byte_level_tokenizer()
    ids = _token_ids(tok, "👋🏽日本")
    partial = [tok.decode(ids[:i]) for i in range(1, len(ids))]
    assert any(p.endswith("\ufffd") for p in partial)  # the tricky case is present


def test_decode_calls_stay_short(tokenizer):
    """Linear in the output: each step decodes a window of a few tokens, not the whole text."""
    lengths = []
    decode = _decode(tokenizer)

    def counting(ids):
        lengths.append(len(ids))
        return decode(ids)

    ids = [t for text in TEXTS * 10 for t in _token_ids(tokenizer, text.encode("ascii", "ignore").decode())]
    detok = IncrementalDetokenizer(counting)
    for t in ids:
        detok.add([t])
    assert detok.text == decode(ids)
    assert max(lengths) <= 16 < len(ids)


def _naive(tok, ids, stops):
    """The reference rule: decode everything after each token; cut before the earliest stop string."""
    decode = _decode(tok)
    for n in range(1, len(ids) + 1):
        text = decode(ids[:n])
        hits = [i for s in stops if (i := text.find(s)) >= 0]
        if hits:
            return n, text[: min(hits)]
    return len(ids), decode(ids)


@pytest.mark.parametrize("seed", range(6))
def test_stop_strings_split_across_tokens_match_the_naive_rule(seed):
    tok = _byte_level_tokenizer()
    rng = random.Random(seed)
    text = rng.choice(TEXTS) + " " + rng.choice(TEXTS)
    ids = _token_ids(tok, text)
    stop = text[rng.randrange(3, len(text) - 3) :][: rng.randint(2, 4)]  # any substring: may split tokens
    collector = Collector(StopConfig(max_new_tokens=1000, stop_strings=(stop,)), _decode(tok))
    rng_rounds = list(ids)
    while rng_rounds and not collector.done:
        k = rng.randint(1, 4)
        collector.feed(Round(tokens=rng_rounds[:k]))
        rng_rounds = rng_rounds[k:]
    n, want = _naive(tok, ids, [stop])
    assert collector.result().text == want and len(collector.tokens) == n
    assert collector.finish_reason == "stop"


def test_streamed_text_only_grows_and_never_shows_a_stop_string():
    tok = _byte_level_tokenizer()
    ids = _token_ids(tok, "héllo wörld 日本語 STOP ignored")
    collector = Collector(StopConfig(max_new_tokens=1000, stop_strings=("STOP",)), _decode(tok))
    shown = []
    for t in ids:
        if collector.done:
            break
        collector.feed(Round(tokens=[t]))
        shown.append(collector.text(len(collector.tokens)))
    assert all(b.startswith(a) for a, b in zip(shown, shown[1:], strict=False))
    assert all("STOP" not in s and "\ufffd" not in s for s in shown)
    assert collector.result().text == "héllo wörld 日本語 "
