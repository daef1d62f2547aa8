"""Benchmark methods: `NAME[:key=value,...]` specs -> objects with one `run(prompt_ids)` contract.

Our methods are the registry's (`decoding.registry.METHODS`: ar, sd, pearl) and their keys are the
option names of `options.OPTIONS` that the method reads (sd: drafter, draft_length, draft_schedule
(alias schedule), confidence_threshold (alias threshold), verifier; pearl: drafter, verifier, gamma,
pre_verify, post_verify, parallel), with the same defaults as the CLI. The peers run transformers'
own generate() on the same loaded target: "hf-ar" (plain greedy decoding) and "hf-assisted"
(assistant_model= or prompt_lookup_num_tokens=; keys drafter, draft_length, schedule), and llama.cpp
on the target's GGUF: "llama-cpp" (keys quantize=gguf|q4_0|q4_1|q8_0|bf16 and lookup=N;
bench/peers/llama_cpp_peer.py), and its own draft-model speculation (draft=NAME|FILE.gguf, draft_max, draft_min,
p_min; bench/peers/llama_spec_peer.py); "ik-llama-cpp" (key repack=1: its rows interleaved) and "openvino" (keys
lookup=N: OpenVINO GenAI's prompt lookup; draft=NAME|FILE.gguf and draft_max=N: its draft-model
speculation) on the same file. Every
method of ours also takes `runtime` and `quantize` (a quantized target: `ar:quantize=int4`,
`sd:quantize=gguf`), and `temperature`, `top_k`, `top_p`: a sampled run
(`sd:temperature=0.8`; seeded per run, so reproducible; its rows are never compared token for token,
the distribution is what the tests check).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from quickdraft.bench.outputs import RunOutput
from quickdraft.bench.peers.ik_llama_cpp_peer import IkLlamaCppMethod
from quickdraft.bench.peers.llama_cpp_peer import KEYS as LLAMA_CPP_KEYS
from quickdraft.bench.peers.llama_cpp_peer import LlamaCppMethod
from quickdraft.bench.peers.llama_spec_peer import SPEC_KEYS, LlamaSpecMethod
from quickdraft.bench.peers.openvino_peer import OpenVinoMethod
from quickdraft.decoding.registry import METHODS
from quickdraft.drafters import KINDS, make_drafter, parse_drafter_spec
from quickdraft.engine import Engine
from quickdraft.errors import QuickdraftError
from quickdraft.settings.options import OPTIONS, option_name, options_from, request_from
from quickdraft.weights.loading import LoadedModel

PEERS = {
    "hf-ar": (),
    "hf-assisted": ("drafter", "draft_length", "schedule"),
    "llama-cpp": (*LLAMA_CPP_KEYS, *SPEC_KEYS),
    "ik-llama-cpp": ("repack",),
    "openvino": ("lookup", "draft", "draft_max"),
}
KEYS = {**{name: m.options for name, m in METHODS.items()}, **PEERS}
SAMPLING = ("temperature", "top_k", "top_p")  # per-request keys our methods take (`sd:temperature=0.8`)


def _check_key(method: str, key: str) -> None:
    where = f"method {method!r}: "
    if method not in PEERS:
        option_name(key, ("runtime", "quantize", *METHODS[method].options, *SAMPLING), where)
    elif key not in PEERS[method]:
        raise QuickdraftError(f"{where}no option {key!r} (options: {', '.join(PEERS[method]) or 'none'})")


def _is_key(method: str, key: str) -> bool:
    try:
        _check_key(method, key)
    except QuickdraftError:
        return False
    return True


@dataclass(frozen=True)
class MethodSpec:
    """A parsed method string; `text` (normalised) names it in every report."""

    name: str
    options: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        return f"{self.name}:{opts}" if opts else self.name

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.options).get(key, default)


def parse_methods(text: str) -> list[MethodSpec]:
    """Split "ar,sd:drafter=ngram,draft_length=3,hf-assisted:drafter=ngram" into MethodSpecs.

    A comma-separated item that does not start with a method name continues the previous method's
    options, so values may themselves contain ':' (drafter=model:PATH); an item that is not one of
    the method's keys continues the previous value, so values may contain ',' too
    (verifier=specdec:beta=3,tau=1; drafter=csd:distilled>mag;k=2,4/4).
    """
    specs: list[tuple[str, list[tuple[str, str]]]] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        head, sep, rest = item.partition(":")
        if head in KEYS:
            specs.append((head, []))
            item = rest if sep else ""
        elif not specs:
            raise QuickdraftError(f"unknown method {head!r}; choose from {', '.join(KEYS)}")
        if item:
            key, eq, value = item.partition("=")
            if specs[-1][1] and not _is_key(specs[-1][0], key):  # a value with a comma in it
                last_key, last_value = specs[-1][1][-1]
                specs[-1][1][-1] = (last_key, f"{last_value},{item}")
                continue
            if not eq or not value:
                raise QuickdraftError(f"method option {item!r} must look like key=value")
            _check_key(specs[-1][0], key)
            specs[-1][1].append((key, value))
    if not specs:
        raise QuickdraftError("no methods given")
    return [MethodSpec(name, tuple(opts)) for name, opts in specs]


def _int(spec: MethodSpec, key: str, default: int) -> int:
    try:
        return int(spec.get(key, str(default)))
    except ValueError:
        raise QuickdraftError(f"{spec.text}: {key} must be an integer") from None


class QuickdraftMethod:
    """Our own methods (ar, sd, pearl) through the Engine, options parsed as everywhere else."""

    def __init__(
        self, spec: MethodSpec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none"
    ) -> None:
        self.spec = spec
        own = {k: v for k, v in spec.options if option_name(k, OPTIONS) not in SAMPLING}
        self.sampling = {k: v for k, v in spec.options if option_name(k, OPTIONS) in SAMPLING}
        request_from(self.sampling, where=f"{spec.text}: ")  # a bad value is refused here, at build
        self.seeds = 0  # runs so far: each sampled run's seed (reproducible, one stream per run)
        values = {"method": spec.name, "dtype": dtype, "runtime": runtime, "quantize": quantize, **own}
        allowed = ("method", "dtype", "runtime", "quantize", *METHODS[spec.name].options)
        config = options_from(values, allowed=allowed, where=f"{spec.text}: ")
        self.engine = Engine(target, config)
        self.costs: list[float] | None = None  # relative step costs of the draft components (bench/cost.py)

    @property
    def speculative(self) -> bool:
        return METHODS[self.spec.name].uses_drafter

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunOutput:
        from quickdraft.bench.cost import draft_steps, relative_costs

        self.seeds += 1  # greedy unless the method's own keys sample (temperature=, top_k=, top_p=)
        request = request_from({"max_new_tokens": max_new_tokens, **self.sampling, "seed": self.seeds})
        stop = request.stop_config(self.engine.target_info.eos_token_ids)
        res = self.engine.generate_ids(prompt_ids, request.sampling, stop)
        s = res.stats
        units = 0.0 if self.spec.name == "ar" else None
        if self.spec.name == "sd":
            steps = draft_steps(self.engine)  # read before measuring (measuring runs the drafters)
            if self.costs is None:  # measured once, after a generation bound the drafter to the target
                self.costs = relative_costs(self.engine)
            units = sum(c * n for c, n in zip(self.costs, steps, strict=True))
        return RunOutput(
            res.token_ids,
            s.wall_s,
            s.num_target_forwards,
            s.num_drafts,
            s.num_draft_tokens,
            s.num_accepted_draft_tokens,
            s.drafted_per_position,
            s.accepted_per_position,
            s.accepted_lengths,
            dict(s.extra),
            units,
            s.prefill_s,
        )

    def run_batch(
        self, prompts: list[list[int]], max_new_tokens: int, max_batch: int | None
    ) -> tuple[list[list[int]], float] | None:
        """Every prompt in one continuous batch (`Engine.generate_batch`, at most `max_batch` rows,
        None: fitted): (outputs, wall seconds), or None when this method cannot batch."""
        if self.engine.batch_unsupported() is not None:
            return None
        self.engine.batch_plan()  # the host's batched costs are measured before the clock starts
        request = request_from({"max_new_tokens": max_new_tokens, **self.sampling, "seed": 0})
        stop = request.stop_config(self.engine.target_info.eos_token_ids)
        start = time.perf_counter()
        results = self.engine.generate_batch(prompts, request.sampling, stop, max_batch)
        return [r.token_ids for r in results], time.perf_counter() - start

    def close(self) -> None:
        self.engine.close()


class HFAssisted:
    """The peers: transformers' own generate() on the same target, plain greedy ("hf-ar") or with
    assisted decoding ("hf-assisted", same draft).

    Target forwards are counted with a forward pre-hook; HF reports no acceptance counts, so only
    tokens per target forward is available.
    """

    def __init__(
        self, spec: MethodSpec, target: LoadedModel, dtype: str, runtime: str = "hf", quantize: str = "none"
    ) -> None:
        self.spec, self.target = spec, target  # transformers' generate(): its own forward, always
        self.speculative = spec.name == "hf-assisted"
        self.forwards = 0
        self.kwargs: dict = {}
        if not self.speculative:
            return
        drafter = spec.get("drafter", "ngram")  # transformers' own prompt lookup: the peer of our default
        k = _int(spec, "draft_length", OPTIONS["draft_length"].default)
        schedule = spec.get("schedule", "constant")
        if schedule not in ("constant", "heuristic"):
            raise QuickdraftError(f"{spec.text}: hf-assisted schedule is constant or heuristic")
        stages = parse_drafter_spec(drafter)
        if len(stages) == 1 and KINDS[stages[0].kind].hf_prompt_lookup:
            self.kwargs["prompt_lookup_num_tokens"] = k
        else:
            if len(stages) > 1 or not KINDS[stages[0].kind].hf_model:
                able = ", ".join(k.usage for k in KINDS.values() if k.hf_model)
                raise QuickdraftError(f"{spec.text}: hf-assisted takes drafter=ngram or {able}, not {drafter}")
            assistant = make_drafter(stages, target, dtype).model.model
            assistant.generation_config.num_assistant_tokens = k
            assistant.generation_config.num_assistant_tokens_schedule = schedule
            self.kwargs["assistant_model"] = assistant

    def close(self) -> None:
        """Nothing started."""

    def _count(self, module, args) -> None:
        self.forwards += 1

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunOutput:
        ids = torch.tensor([prompt_ids])
        eos = list(self.target.eos_token_ids)
        self.forwards = 0
        hook = self.target.model.register_forward_pre_hook(self._count)
        try:
            start = time.perf_counter()
            out = self.target.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos or None,
                pad_token_id=eos[0] if eos else None,
                **self.kwargs,
            )
            wall = time.perf_counter() - start
        finally:
            hook.remove()
        return RunOutput(out[0, len(prompt_ids) :].tolist(), wall, self.forwards)


def _llama_cpp(spec: MethodSpec, *args):
    """llama.cpp: its own draft-model speculation when `draft=` names a draft, else plain or lookup."""
    if spec.get("draft") is None:
        if any(spec.get(k) is not None for k in SPEC_KEYS):
            raise QuickdraftError(f"{spec.text}: draft_max, draft_min and p_min need draft=NAME|FILE.gguf")
        return LlamaCppMethod(spec, *args)
    if spec.get("lookup") is not None:
        raise QuickdraftError(f"{spec.text}: choose draft= or lookup=, not both")
    return LlamaSpecMethod(spec, *args)


PEER_CLASSES = {
    "hf-ar": HFAssisted,
    "hf-assisted": HFAssisted,
    "llama-cpp": _llama_cpp,
    "ik-llama-cpp": IkLlamaCppMethod,
    "openvino": OpenVinoMethod,
}


def build_method(spec: MethodSpec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none"):
    """A bench method; `quantize` is the default weights of ours (peers run transformers' own forward
    on the loaded weights, never quantized)."""
    return PEER_CLASSES.get(spec.name, QuickdraftMethod)(spec, target, dtype, runtime, quantize)
