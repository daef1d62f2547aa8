"""Engine: a loaded target + drafter behind one `generate()` (the Python API and the CLI's core).

It turns prompts (text, chat messages or token ids) into ids, validates the request, builds the
method's decode loop by name and collects the result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding import Autoregressive, Generators, SpeculativeDecoder
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.decoding.collect import Collector, run_to_end
from quickdraft.decoding.pearl import PearlConfig, PearlDecoder, gamma_from_costs, step_seconds
from quickdraft.drafters import Drafter, make_drafter, parse_drafter_spec
from quickdraft.errors import ContextLengthError, QuickdraftError
from quickdraft.models.cached_model import CachedModel
from quickdraft.models.loading import LoadedModel, load_model
from quickdraft.types import GenerationResult
from quickdraft.verifiers import make_verifier

METHODS = ("ar", "sd", "pearl")
Prompt = str | Sequence[dict] | Sequence[int]


@dataclass(frozen=True)
class EngineConfig:
    """What an Engine runs: method name, drafter spec, draft length policy, verifier name."""

    method: str = "sd"
    drafter: str = "ngram"
    draft: DraftConfig = field(default_factory=DraftConfig)
    verifier: str | None = None
    pearl: PearlConfig = field(default_factory=PearlConfig)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise QuickdraftError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.method != "ar":
            parse_drafter_spec(self.drafter)  # a bad spec is refused before any model loads


class Engine:
    """A target model, optionally a drafter, and the decode loop chosen by `config.method`."""

    def __init__(
        self, target: LoadedModel, config: EngineConfig, drafter: Drafter | None = None, dtype: str = "bfloat16"
    ) -> None:
        self.target_info = target
        self.config = config
        self.dtype = dtype
        self._parallel = None
        self._pearl_gamma: int | None = None
        self._max_token_chars: int | None = None
        self.target = CachedModel(target.model, target.vocab_size)
        if config.method == "ar":
            self.drafter = None
        else:
            self.drafter = drafter or make_drafter(config.drafter, target, dtype)

    @classmethod
    def load(
        cls,
        target: str | None = None,
        config: EngineConfig | None = None,
        dtype: str = "bfloat16",
        threads: int | None = None,
    ) -> Engine:
        """Load `target` (a local HF folder, or None for the embedded default) and build the drafter."""
        if threads is not None:
            if threads < 1:
                raise QuickdraftError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        return cls(load_model(target, dtype), config or EngineConfig(), dtype=dtype)

    # --- prompts --------------------------------------------------------------------------
    def encode(self, prompt: Prompt, raw: bool = False) -> list[int]:
        """Token ids for a text prompt (chat template applied unless raw), chat messages or ids."""
        tok = self.target_info.tokenizer
        if isinstance(prompt, str):
            if not prompt:
                raise QuickdraftError("prompt is empty")
            self._check_chars(len(prompt))
            if tok is None:
                raise QuickdraftError("this target has no tokenizer: pass token ids")
            if raw or not tok.chat_template:
                return list(tok(prompt, add_special_tokens=True).input_ids)
            prompt = [{"role": "user", "content": prompt}]
        if len(prompt) == 0:
            raise QuickdraftError("prompt is empty")
        if all(isinstance(m, dict) for m in prompt):
            if tok is None or not tok.chat_template:
                raise QuickdraftError("chat messages need a target with a chat template")
            self._check_chars(sum(len(str(m.get("content", ""))) for m in prompt))
            text = tok.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
            return list(tok(text, add_special_tokens=False).input_ids)
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.target.vocab_size]
        if bad:
            raise QuickdraftError(f"token id {bad[0]} is outside the vocabulary [0, {self.target.vocab_size})")
        return ids

    def _check_chars(self, num_chars: int) -> None:
        """Refuse, before tokenizing, a text that must exceed the context: no token is longer than the
        longest vocabulary entry, so it has at least num_chars / that many tokens."""
        if self._max_token_chars is None:
            self._max_token_chars = max(map(len, self.target_info.tokenizer.get_vocab()), default=1)
        if num_chars > self.context_length * self._max_token_chars:
            raise ContextLengthError(
                f"prompt of {num_chars} characters cannot fit the model's context length of "
                f"{self.context_length} tokens"
            )

    def detokenize(self, ids: list[int]) -> str:
        tok = self.target_info.tokenizer
        return tok.decode(ids, skip_special_tokens=True) if tok is not None else ""

    # --- generation -----------------------------------------------------------------------
    def _decoder(self, sampling: SamplingConfig):
        if self.drafter is None:
            return Autoregressive(self.target)
        verifier = make_verifier(self.config.verifier, sampling)
        if self.config.method == "pearl":
            return PearlDecoder(self.target, self.drafter, verifier, self.config.pearl, self.pearl_gamma)
        return SpeculativeDecoder(self.target, self.drafter, verifier, lambda: make_draft_policy(self.config.draft))

    @property
    def pearl_gamma(self) -> int:
        """PEARL's window: the configured one, else measured once (target step / draft step)."""
        if self.config.pearl.gamma is not None:
            return self.config.pearl.gamma
        if self._pearl_gamma is None:
            model = getattr(self.drafter, "model", None)
            self._pearl_gamma = gamma_from_costs(step_seconds(self.target), model and step_seconds(model))
        return self._pearl_gamma

    @property
    def context_length(self) -> int:
        return self.target.max_length

    def check_length(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise if the prompt plus the token budget does not fit the target's context."""
        limit = self.context_length
        if num_prompt_tokens + max_new_tokens > limit:
            raise ContextLengthError(
                f"prompt ({num_prompt_tokens} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"model's context length of {limit} tokens"
            )

    def _start(self, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig):
        self.check_length(len(prompt_ids), stop.max_new_tokens)
        decoder = self._decoder(sampling)
        rounds = decoder.rounds(prompt_ids, sampling, stop.max_new_tokens, Generators.from_seed(sampling.seed))
        detokenize = self.detokenize if self.target_info.tokenizer else None
        collector = Collector(stop, detokenize, decoder.lossy)
        collector.stats.verifier = getattr(getattr(decoder, "verifier", None), "name", "")
        return rounds, collector

    def parallel_runner(self):
        """The two PEARL worker processes (started on first use; `close()` stops them)."""
        if self._parallel is None:
            from quickdraft.decoding.pearl_parallel import ParallelPearl, ParallelSpec, split_cores

            spec = ParallelSpec(
                self.target_info.name,
                self.config.drafter,
                self.dtype,
                self.config.pearl,
                self.config.verifier,
                split_cores(),
            )
            self._parallel = ParallelPearl(spec)
        return self._parallel

    def close(self) -> None:
        """Stop worker processes, if any."""
        if self._parallel is not None:
            self._parallel.close()
            self._parallel = None

    def generate_ids(self, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig) -> GenerationResult:
        """Generate from token ids (validated against the context length)."""
        if self.config.method == "pearl" and self.config.pearl.parallel:
            self.check_length(len(prompt_ids), stop.max_new_tokens)
            make_verifier(self.config.verifier, sampling)  # refuse bad combinations here, not in a worker
            return self.parallel_runner().generate(list(prompt_ids), sampling, stop)
        return run_to_end(*self._start(prompt_ids, sampling, stop))

    def stream_ids(
        self, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig
    ) -> Iterator[tuple[list[int], Collector]]:
        """Yield (tokens added, collector) after every round, in order; stopping the iteration early
        (close()) ends the generation within that round. `collector.result()` gives the totals."""
        if self.config.method == "pearl" and self.config.pearl.parallel:
            raise QuickdraftError("parallel PEARL does not stream; use generate, or the sequential PEARL to stream")
        rounds, collector = self._start(prompt_ids, sampling, stop)
        try:
            for rnd in rounds:
                kept = collector.feed(rnd)
                yield kept, collector
                if collector.done:
                    break
        finally:
            rounds.close()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        raw: bool = False,
    ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt or a list of prompts (each run alone, batch size 1).

        A prompt is a string, a list of chat messages ({"role", "content"}) or a list of token ids;
        a list of those gives a list of results. `seed` makes sampling reproducible.
        """
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        stop_cfg = StopConfig(max_new_tokens, self.target_info.eos_token_ids, tuple(stop or ()))
        many = isinstance(prompts, (list, tuple)) and len(prompts) > 0 and not isinstance(prompts[0], (dict, int))
        items = list(prompts) if many else [prompts]
        results = [self.generate_ids(self.encode(p, raw), sampling, stop_cfg) for p in items]
        return results if many else results[0]


_ENGINES: dict[tuple, Engine] = {}


def generate(
    prompts: Prompt | Sequence[Prompt],
    *,
    target: str | None = None,
    method: str = "sd",
    drafter: str = "ngram",
    draft_length: int = 4,
    draft_schedule: str = "fixed",
    dtype: str = "bfloat16",
    threads: int | None = None,
    **kwargs,
) -> GenerationResult | list[GenerationResult]:
    """One-call API: load (and cache) an Engine, then `Engine.generate(prompts, **kwargs)`.

    Example:
        >>> import quickdraft
        >>> out = quickdraft.generate("What is 2+2?", max_new_tokens=32)     # doctest: +SKIP
        >>> out.text, out.stats.mean_acceptance_length                      # doctest: +SKIP
    """
    config = EngineConfig(method=method, drafter=drafter, draft=DraftConfig(draft_length, draft_schedule))
    key = (target, config, dtype)
    if key not in _ENGINES:
        _ENGINES.clear()  # keep one loaded model set
        _ENGINES[key] = Engine.load(target, config, dtype, threads)
    elif threads is not None:
        torch.set_num_threads(threads)
    return _ENGINES[key].generate(prompts, **kwargs)
