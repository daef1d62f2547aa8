"""Engine: a loaded target, its drafter and a decoder chosen from the method registry.

The Engine holds state (the target's cache owner, the drafter, what a decoder started once) and
runs requests; what to run comes from `EngineConfig` (settings/options.py), how from
`decoding.registry.METHODS`, prompts go through `PromptCodec` (prompts.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.costs.batch_costs import BATCHES, batch_cost_surface, fit_max_batch
from quickdraft.decoding import Generators
from quickdraft.decoding.batch import BatchDecoder, run_batch
from quickdraft.decoding.batch_plan import BatchPlan
from quickdraft.decoding.collect import Collector, run_to_end
from quickdraft.decoding.guard import DraftGuard
from quickdraft.decoding.parts import DecodeParts, draft_cost, round_cost
from quickdraft.decoding.registry import METHODS, auto_chain, draft_policy, pearl_gamma
from quickdraft.drafters import Drafter, make_drafter
from quickdraft.drafters.base import FEATURES, bind_target
from quickdraft.errors import ContextLengthError, QuickdraftError
from quickdraft.prompts import Prompt, PromptCodec
from quickdraft.runtime.caches.batched import BatchedTarget
from quickdraft.runtime.choose import eager_attention, resolve_device
from quickdraft.runtime.forward.graphs import StaticBatchForward
from quickdraft.runtime.target import Target
from quickdraft.settings.defaults import resolve
from quickdraft.settings.options import EngineConfig, RequestOptions, options_from, request_from
from quickdraft.types import GenerationResult
from quickdraft.weights.default import fixed_weights
from quickdraft.weights.loading import LoadedModel, load_model


class Engine:
    """A target model, optionally a drafter, and the decoder of `config.method`.

    Args:
        target: the loaded target.
        config: the options (`dtype` overrides config.dtype when given, for older callers); `quantize`
            and `drafter` left at auto are resolved here (`settings/defaults.py`), with their reasons in `choices`.
        drafter: a ready drafter (default: built from config.drafter when the method drafts).
        suffix_cache: tokens of earlier requests' outputs the suffix stages keep (the server's; 0: none).
    """

    def __init__(
        self,
        target: LoadedModel,
        config: EngineConfig | None = None,
        drafter: Drafter | None = None,
        dtype: str | None = None,
        suffix_cache: int = 0,
    ) -> None:
        config = config or EngineConfig()
        if dtype is not None and dtype != config.dtype:
            config = options_from({"dtype": dtype}, config)
        self.requested = config  # as asked, auto left auto (`api.generate` keys its engine by it)
        self.target_info, self.config, self.dtype = target, config, config.dtype
        self.method = METHODS[config.method]
        self.device = resolve_device(config.device)
        if self.device != "cpu" and (self.method.cpu_only or config.quant.active):
            what = f"method {config.method!r}" if self.method.cpu_only else f"--quantize {config.quantize}"
            raise QuickdraftError(f"--device {self.device}: {what} runs on the CPU only so far")
        if target.model.device.type != self.device:  # the target (and what reads its weights) on the device
            target.model.to(self.device)
        self.graphs = config.graphs == "on" or (config.graphs == "auto" and self.device == "cuda")
        # every auto resolved once (settings/defaults.py); `choices`: what the defaults picked and why
        uses = self.method.uses_drafter
        config, built, self.choices = resolve(config, target, self.device, uses, drafter is None, suffix_cache)
        self.target: Target = built.target
        self.quantized, self.info = built.quantized, built.info
        self.prompts = PromptCodec(target.tokenizer, self.target.vocab_size, self.target.max_length)
        self.drafter = (
            (drafter or make_drafter(config.drafter_stages, target, config.dtype, config.runtime)) if uses else None
        )
        self.config = config
        self.parts = DecodeParts(self.target, self.drafter, config, target.name)

    @classmethod
    def load(
        cls,
        target: str | None = None,
        config: EngineConfig | None = None,
        dtype: str | None = None,
        threads: int | None = None,
        suffix_cache: int = 0,
    ) -> Engine:
        """Load the target (`target` or config.target: a local HF folder, None for the embedded
        default) in `dtype` or config.dtype, with `threads` or config.threads, and build the drafter."""
        given = {k: v for k, v in (("target", target), ("dtype", dtype), ("threads", threads)) if v is not None}
        config = options_from(given, config or EngineConfig())
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        return cls(load_model(config.target, config.dtype), config, suffix_cache=suffix_cache)

    def encode(self, prompt: Prompt, raw: bool = False) -> list[int]:
        """Token ids of a prompt (text, chat messages or ids; `raw`: no chat template): the codec's."""
        return self.prompts.encode(prompt, raw)

    # --- generation -----------------------------------------------------------------------
    @property
    def pearl_gamma(self) -> int:
        """PEARL's window: the configured one, else measured once (target step / draft step)."""
        return pearl_gamma(self.parts)

    def parallel_runner(self):
        """The running PEARL worker pair (started on first use; `close()` stops it)."""
        self.method.build(self.parts, SamplingConfig())
        runner = self.parts.started.get("pearl_parallel")
        if runner is None:
            raise QuickdraftError("this engine does not run parallel PEARL")
        return runner

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
        decoder = self.method.build(self.parts, sampling)
        rounds = decoder.rounds(
            prompt_ids, sampling, stop.max_new_tokens, Generators.from_seed(sampling.seed, self.device)
        )
        detokenize = self.prompts.decode if self.prompts.tokenizer is not None else None
        collector = Collector(stop, detokenize, decoder.lossy, self.parts.held)
        collector.stats.verifier = decoder.verifier.name if decoder.verifier is not None else ""
        collector.stats.ran = self.ran()
        return rounds, collector

    def ran(self) -> dict[str, str]:
        """What runs, as statistics report it: the method, the drafter as resolved (the default
        included; "" for plain decoding), the target, its weights, the runtime and the device."""
        drafter = self.drafter.name if self.drafter is not None else ""
        ran = {"method": self.config.method, "drafter": drafter, **self.info.to_dict()}
        if self.choices:  # what the defaults picked and why, one line
            ran["choice"] = "; ".join(f"{what} {why}" for what, why in self.choices.items())
        return ran

    def graph_report(self) -> dict[str, float | int] | None:
        """What the lone decoder's captured graphs cost (`runtime/forward/capture.py`); None: none here."""
        decoder = self.parts.memo.get(("batch_decoder", 1))
        capturer = decoder and decoder.target.static and decoder.target.static.capturer
        return capturer.report() if capturer else None

    def kept_decoder(self, max_batch: int | None) -> BatchDecoder:
        """The batch decoder of `max_batch` rows, made once (its graphs captured then: `batch_decoder`)
        and kept; rows an earlier call left in it (one that failed inside) are dropped first."""
        key = ("batch_decoder", max_batch)
        decoder = self.parts.memo[key] = self.parts.memo.get(key) or self.batch_decoder(max_batch)
        if not decoder.idle:
            decoder.abort()
        return decoder

    def close(self) -> None:
        """Stop worker processes, if any."""
        self.parts.close()

    def generate_ids(self, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig) -> GenerationResult:
        """Generate from token ids (validated against the context length). With `graphs` on and a
        batchable engine, one request runs as a batch of one over the static (graphed) forward."""
        if self.graphs and self.batch_unsupported() is None:
            self.check_length(len(prompt_ids), stop.max_new_tokens)
            return run_batch(self.kept_decoder(1), [(prompt_ids, sampling, stop)])[0].result()
        with eager_attention():  # nothing captured: no cuDNN plan per shape on a GPU
            return run_to_end(*self._start(prompt_ids, sampling, stop))

    def stream_ids(
        self, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig
    ) -> Iterator[tuple[list[int], Collector]]:
        """Yield (tokens added, collector) after every round, in order; stopping the iteration early
        (close()) ends the generation within that round. `collector.result()` gives the totals."""
        rounds, collector = self._start(prompt_ids, sampling, stop)
        try:
            for rnd in rounds:
                kept = collector.feed(rnd)
                yield kept, collector
                if collector.done:
                    break
        finally:
            rounds.close()

    # --- batched generation ------------------------------------------------------------------
    def batch_unsupported(self) -> str | None:
        """Why this engine cannot decode several sequences in one batch (None: it can); found once."""
        if "batch_reason" not in self.parts.memo:
            self.parts.memo["batch_reason"] = self._batch_reason()
        return self.parts.memo["batch_reason"]

    def _batch_reason(self) -> str | None:
        if not self.method.batches:
            return f"method {self.config.method!r} decodes one sequence at a time"
        if not self.target.supports_batches:
            return "the target does not run on the native runtime"
        if self.config.verifier not in (None, "greedy", "speculative"):
            return f"verifier {self.config.verifier!r} (a batch verifies with the lossless rules)"
        if self.drafter is None:
            return None
        bind_target(self.drafter, self.target)  # Kangaroo forks from its handle on the target's layers
        fork = self.drafter.fork()
        if fork is None:
            return f"drafter {self.drafter.name!r} drafts one sequence at a time"
        if set(fork.target_layers) - {FEATURES}:
            return f"drafter {self.drafter.name!r} reads target layers a batch does not hand over"
        return None

    def batch_plan(self) -> tuple[BatchPlan, int]:
        """(the draft budget by batch size, the default batch size), read off this host's measured batched
        cost surface (costs/batch_costs.py; measured once per engine, persisted for the embedded default and
        the named targets, whose weights are fixed by checksum); each decoder's own (it calibrates)."""
        drafter = self.drafter
        draft, pmin = auto_chain(self.parts)  # a draft model's p-min chain where no draft option is given
        auto = drafter is not None and drafter.drafts_trees and draft.tree is None and bool(drafter.tree_gain)
        gain = drafter.tree_gain if auto else None
        fixed = 0 if drafter is None or auto else (draft.tree or draft.num_draft_tokens)
        keep = draft_policy(self.parts, draft).keep_drafting if pmin else None  # priced as a lone row's
        if "batch_surface" not in self.parts.memo:
            name, probe = self.target_info.name or "", lambda: BatchedTarget(self.target, max(BATCHES))
            surface = batch_cost_surface(probe, name, self.dtype, fixed_weights(name), self.config.quantize)
            self.parts.memo["batch_surface"] = surface
        surface = self.parts.memo["batch_surface"]
        trees = drafter is not None and drafter.drafts_trees and (auto or bool(draft.tree))
        cost = draft_cost(self.parts, not trees) if auto else None  # a row's drafting, priced beside the forward
        plan = BatchPlan(surface, gain, fixed, trees, draft.tree_width, keep_drafting=keep, draft_cost=cost)
        return plan, fit_max_batch(surface, plan.budgets, gain, drafting=cost)  # the table's own gains

    def batch_decoder(
        self, max_batch: int | None = None, prefill_chunk: int = 128, graphs: bool | None = None
    ) -> BatchDecoder:
        """A continuous-batching decoder over this engine's target and drafter (`decoding/batch.py`), of
        `max_batch` rows (default: fitted to this host); `graphs` (default: the engine's setting): the static
        forward, graphed on a GPU, every graph captured here (runtime/forward/graphs.py)."""
        reason = self.batch_unsupported()
        if reason is not None:
            raise QuickdraftError(f"batched decoding is not available: {reason}")
        plan, fitted = self.batch_plan()
        if max_batch is not None and max_batch < 1:
            raise QuickdraftError(f"max_batch must be >= 1, got {max_batch}")
        detokenize = self.prompts.decode if self.prompts.tokenizer is not None else None
        target = BatchedTarget(self.target, max_batch or fitted)
        if graphs if graphs is not None else self.graphs:
            target.static = StaticBatchForward(target, self.target.max_length, graphs=self.device == "cuda")
            target.static.prepare(1 + (plan.widest if self.drafter is not None else 0))  # before any timing
        decoder = BatchDecoder(target, self.drafter, plan, detokenize, prefill_chunk)
        decoder.ran = self.ran()
        if self.drafter is not None and self.config.draft.guard:  # never slower than a plain batch
            decoder.guard = DraftGuard(round_cost(self.parts, not plan.trees), carries=True)
            decoder.draft_cost = draft_cost(self.parts, not plan.trees)
        return decoder

    def generate_batch(
        self, prompts_ids: Sequence[list[int]], sampling: SamplingConfig, stop: StopConfig, max_batch: int | None = None
    ) -> list[GenerationResult]:
        """Generate for many prompts (token ids) decoded together: continuous batching, at most
        `max_batch` at once (default: fitted to this host); each result is what its prompt gives alone."""
        for ids in prompts_ids:
            self.check_length(len(ids), stop.max_new_tokens)
        decoder = self.kept_decoder(max_batch) if self.graphs else self.batch_decoder(max_batch)
        return [c.result() for c in run_batch(decoder, [(ids, sampling, stop) for ids in prompts_ids])]

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        raw: bool = False,
        request: RequestOptions | None = None,
        **options,
    ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt or a list of prompts (a list runs as one batch where the engine
        can batch: `batch_unsupported`; else one after another).

        A prompt is a string, a list of chat messages ({"role", "content"}) or a list of token ids;
        a list of those gives a list of results. `options` are the per-request options of
        `options.OPTIONS` (max_new_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=None,
        stop=()), over `request` when given; `seed` makes sampling reproducible. `raw` skips the
        chat template.
        """
        settings = request_from(options, request)
        sampling, stop_cfg = settings.sampling, settings.stop_config(self.target_info.eos_token_ids)
        many = isinstance(prompts, (list, tuple)) and len(prompts) > 0 and not isinstance(prompts[0], (dict, int))
        items = list(prompts) if many else [prompts]
        ids = [self.encode(p, raw) for p in items]
        if many and len(ids) > 1 and self.batch_unsupported() is None:
            return self.generate_batch(ids, sampling, stop_cfg)
        results = [self.generate_ids(i, sampling, stop_cfg) for i in ids]
        return results if many else results[0]


__all__ = ["Engine", "EngineConfig", "QuickdraftError"]
