"""Benchmark methods: `NAME[:key=value,...]` specs -> objects with one `run(prompt_ids)` contract.

Names: "ar" (plain decoding), "sd" (speculative decoding; keys drafter, draft_length, schedule,
threshold), "pearl" (keys drafter, gamma (default: measured), pre_verify, post_verify, parallel (0/1;
parallel workers use 1 + 1 of the cores)) and the peer "hf-assisted" (transformers' generate() with assistant_model= or
prompt_lookup_num_tokens=; keys drafter, draft_length, schedule).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding.pearl import PearlConfig
from quickdraft.drafters import make_drafter
from quickdraft.engine import Engine, EngineConfig
from quickdraft.errors import QuickdraftError
from quickdraft.models.loading import LoadedModel

KEYS = {
    "ar": set(),
    "sd": {"drafter", "draft_length", "schedule", "threshold"},
    "hf-assisted": {"drafter", "draft_length", "schedule"},
    "pearl": {"drafter", "gamma", "pre_verify", "post_verify", "parallel"},
}


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
    options, so values may themselves contain ':' (drafter=model:PATH).
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
            if not eq or not value:
                raise QuickdraftError(f"method option {item!r} must look like key=value")
            if key not in KEYS[specs[-1][0]]:
                allowed = ", ".join(sorted(KEYS[specs[-1][0]])) or "none"
                raise QuickdraftError(f"method {specs[-1][0]!r} has no option {key!r} (options: {allowed})")
            specs[-1][1].append((key, value))
    if not specs:
        raise QuickdraftError("no methods given")
    return [MethodSpec(name, tuple(opts)) for name, opts in specs]


@dataclass
class RunOutput:
    """What one method run on one prompt produced (the bench row's measurements)."""

    token_ids: list[int]
    wall_s: float
    target_forwards: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)  # tokens per target forward (ours only)
    extra: dict[str, int] = field(default_factory=dict)  # method-specific counters (PEARL runs)


def _flag(spec: MethodSpec, key: str, default: bool) -> bool:
    value = spec.get(key)
    if value is None:
        return default
    if value not in ("0", "1", "true", "false"):
        raise QuickdraftError(f"{spec.text}: {key} must be 0 or 1")
    return value in ("1", "true")


def _int(spec: MethodSpec, key: str, default: int) -> int:
    try:
        return int(spec.get(key, str(default)))
    except ValueError:
        raise QuickdraftError(f"{spec.text}: {key} must be an integer") from None


class QuickdraftMethod:
    """Our own methods (ar, sd) through the Engine."""

    def __init__(self, spec: MethodSpec, target: LoadedModel, dtype: str) -> None:
        self.spec = spec
        draft = DraftConfig(
            num_draft_tokens=_int(spec, "draft_length", 4),
            schedule=spec.get("schedule", "fixed"),
            confidence_threshold=float(spec.get("threshold", "0.4")),
        )
        pearl = PearlConfig()
        if spec.name == "pearl":
            gamma = spec.get("gamma", "auto")
            pearl = PearlConfig(
                gamma=None if gamma == "auto" else _int(spec, "gamma", 4),
                pre_verify=_flag(spec, "pre_verify", True),
                post_verify=_flag(spec, "post_verify", True),
                parallel=_flag(spec, "parallel", True),
            )
        config = EngineConfig(method=spec.name, drafter=spec.get("drafter", "ngram"), draft=draft, pearl=pearl)
        self.engine = Engine(target, config, dtype=dtype)

    @property
    def speculative(self) -> bool:
        return self.spec.name != "ar"

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunOutput:
        stop = StopConfig(max_new_tokens, self.engine.target_info.eos_token_ids)
        res = self.engine.generate_ids(prompt_ids, SamplingConfig(temperature=0.0), stop)
        s = res.stats
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
        )

    def close(self) -> None:
        self.engine.close()


class HFAssisted:
    """The peer: transformers' generate() with assisted decoding, on the same target and draft.

    Target forwards are counted with a forward pre-hook; HF reports no acceptance counts, so only
    tokens per target forward is available.
    """

    speculative = True

    def __init__(self, spec: MethodSpec, target: LoadedModel, dtype: str) -> None:
        self.spec, self.target = spec, target
        drafter = spec.get("drafter", "ngram")
        k = _int(spec, "draft_length", 4)
        schedule = spec.get("schedule", "constant")
        if schedule not in ("constant", "heuristic"):
            raise QuickdraftError(f"{spec.text}: hf-assisted schedule is constant or heuristic")
        self.kwargs: dict = {}
        if drafter.split(":")[0] == "ngram":
            self.kwargs["prompt_lookup_num_tokens"] = k
        else:
            draft = make_drafter(drafter, target, dtype)
            assistant = draft.model.model
            assistant.generation_config.num_assistant_tokens = k
            assistant.generation_config.num_assistant_tokens_schedule = schedule
            self.kwargs["assistant_model"] = assistant
        self.forwards = 0

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


def build_method(spec: MethodSpec, target: LoadedModel, dtype: str):
    return HFAssisted(spec, target, dtype) if spec.name == "hf-assisted" else QuickdraftMethod(spec, target, dtype)
