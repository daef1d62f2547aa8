"""Prompts in, text out: a target's tokenizer as the library uses it (no models, no decoding).

`PromptCodec.encode` turns a prompt (text, chat messages or token ids) into ids, the chat template
applied to text unless raw; it refuses, before tokenizing, a text that cannot fit the context (a
5 MB body would otherwise cost seconds of tokenization). `IncrementalDetokenizer` turns a growing
list of ids into text in time linear in the output (stop strings and streaming use it).
"""

from __future__ import annotations

from collections.abc import Sequence

from quickdraft.errors import ContextLengthError, QuickdraftError

Prompt = str | Sequence[dict] | Sequence[int]
# fill-in-the-middle tokens (prefix, suffix, middle) by tokenizer family: Qwen2.5-Coder's, StarCoder's
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
# tokens that end a fill-in-the-middle answer where a tokenizer has them (the middle is written; what
# follows them is the model starting another file)
FIM_STOPS = ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<fim_pad>", "<file_sep>")


def context_length(model) -> int:
    """A causal LM's context: max_position_embeddings, unbounded when the config names none."""
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


class PromptCodec:
    """Encode prompts and decode outputs for one target.

    Args:
        tokenizer: a Hugging Face tokenizer, or None (token-id prompts only).
        vocab_size: ids must be below it.
        context_length: the target's context, for the cheap length check before tokenizing.
    """

    def __init__(self, tokenizer: object | None, vocab_size: int, context_length: int) -> None:
        self.tokenizer, self.vocab_size, self.context_length = tokenizer, vocab_size, context_length
        self._max_token_chars: int | None = None

    @classmethod
    def for_target(cls, target) -> PromptCodec:
        """The codec of a LoadedModel: its tokenizer, vocabulary and context (the cache owners' rule)."""
        return cls(target.tokenizer, target.vocab_size, context_length(target.model))

    def check_chars(self, num_chars: int) -> None:
        """Refuse a text that must exceed the context: no token is longer than the longest vocabulary
        entry, so a text has at least num_chars / that many tokens."""
        if self.tokenizer is None:
            return
        if self._max_token_chars is None:
            self._max_token_chars = max(map(len, self.tokenizer.get_vocab()), default=1)
        if num_chars > self.context_length * self._max_token_chars:
            raise ContextLengthError(
                f"prompt of {num_chars} characters cannot fit the model's context length of "
                f"{self.context_length} tokens"
            )

    def encode(self, prompt: Prompt, raw: bool = False) -> list[int]:
        """Token ids for a text prompt (chat template applied unless raw), chat messages or ids."""
        tok = self.tokenizer
        if isinstance(prompt, str):
            if not prompt:
                raise QuickdraftError("prompt is empty")
            if tok is None:
                raise QuickdraftError("this target has no tokenizer: pass token ids")
            self.check_chars(len(prompt))
            if raw or not tok.chat_template:
                return list(tok(prompt, add_special_tokens=True).input_ids)
            prompt = [{"role": "user", "content": prompt}]
        if len(prompt) == 0:
            raise QuickdraftError("prompt is empty")
        if all(isinstance(m, dict) for m in prompt):
            if tok is None or not tok.chat_template:
                raise QuickdraftError("chat messages need a target with a chat template")
            self.check_chars(sum(len(str(m.get("content", ""))) for m in prompt))
            text = tok.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
            return list(tok(text, add_special_tokens=False).input_ids)
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise QuickdraftError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        return ids

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) ids of the tokenizer's fill-in-the-middle tokens, or None."""
        vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
        for names in FIM_TOKENS:
            if all(n in vocab for n in names):
                return tuple(vocab[n] for n in names)  # type: ignore[return-value]
        return None

    def encode_fim(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt: <prefix-token> prefix <suffix-token> suffix <middle-token> (the
        PSM order Qwen2.5-Coder and StarCoder were trained on); the model generates the middle. Refused
        with one line for a tokenizer without FIM tokens."""
        fim = self.fim_tokens()
        if fim is None:
            raise QuickdraftError("this model's tokenizer has no fill-in-the-middle tokens: 'suffix' cannot be used")
        self.check_chars(len(prefix) + len(suffix))
        text = lambda t: list(self.tokenizer(t, add_special_tokens=False).input_ids) if t else []  # noqa: E731
        return [fim[0], *text(prefix), fim[1], *text(suffix), fim[2]]

    def fim_stop_ids(self, eos: Sequence[int] = ()) -> tuple[int, ...]:
        """Ids that end a fill-in-the-middle answer: `eos` (the target's) and FIM_STOPS and the FIM tokens
        themselves, those the tokenizer has."""
        vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
        names = (*FIM_STOPS, *(n for family in FIM_TOKENS for n in family))
        return tuple(sorted({*eos, *(vocab[n] for n in names if n in vocab)}))

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens skipped ("" without a tokenizer)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""


class IncrementalDetokenizer:
    """The text of a growing token list, decoding only a short window per new token (linear overall).

    The text is fixed up to an "anchor" token; only the tokens after it are decoded again with a few
    tokens of left context (vLLM's and TGI's scheme: byte-level tokens decode differently alone, so
    the new text is the difference of two decodes of the window). The anchor moves forward once the
    window's text ends in a complete character, so multi-byte characters split across tokens are
    never emitted half-way; `text` always equals `decode(all ids)` (tested against it).

    Args:
        decode: ids -> text (special tokens skipped).
        context: tokens of left context decoded with the window.
    """

    def __init__(self, decode, context: int = 4) -> None:
        self.decode, self.context = decode, context
        self.ids: list[int] = []
        self._fixed = ""  # text of ids[:anchor]
        self._anchor = 0
        self._tail = ""  # text of ids[anchor:] (in the context of what precedes)

    @property
    def text(self) -> str:
        return self._fixed + self._tail

    def _window_text(self, start: int, end: int) -> str:
        """Text that ids[start:end] add after ids[:start] (decoded with `context` tokens before)."""
        left = max(0, start - self.context)
        prefix = self.decode(self.ids[left:start]) if start > left else ""
        full = self.decode(self.ids[left:end])
        return full[len(prefix) :] if full.startswith(prefix) else full

    def add(self, ids: Sequence[int]) -> str:
        """Append ids; returns the full text so far."""
        self.ids.extend(int(t) for t in ids)
        self._tail = self._window_text(self._anchor, len(self.ids))
        if self._tail and not self._tail.endswith("\ufffd") and len(self.ids) - self._anchor > self.context:
            self._fixed += self._tail  # complete characters only: fix them and move the anchor
            self._tail, self._anchor = "", len(self.ids)
        return self.text
