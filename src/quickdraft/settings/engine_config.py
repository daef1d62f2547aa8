"""What an engine runs (`EngineConfig`) and what one request sets (`RequestOptions`): typed, validated
once when built (the drafter and quantize specs parsed here, at the edge, into values that travel).
`settings/options.py` maps names, flags, YAML keys and bench keys onto them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from quickdraft.config import DTYPES, DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding.pearl_logic import PearlConfig
from quickdraft.decoding.registry import METHODS
from quickdraft.drafters.kinds import DrafterSpec
from quickdraft.drafters.spec import parse_drafter_spec
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.choose import RUNTIMES, forces_reference, resolve_device
from quickdraft.runtime.quant.modes import QuantSpec, parse_quantize
from quickdraft.settings.defaults import AUTO


@dataclass(frozen=True)
class EngineConfig:
    """What an Engine runs and how it loads (defaults: speculative decoding with the drafter and the
    weights `settings/defaults.py` picks for the target and the host once it loads: the fastest lossless path
    measured, docs/benchmarks.md).

    Attributes:
        method: a name in `decoding.registry.METHODS` (ar, sd, pearl).
        drafter: a drafter spec (`drafters/spec.py`), or auto (the default: `defaults.auto_drafter`
            picks it once the target loads); unused by ar.
        draft: draft length and schedule.
        verifier: greedy | speculative | lenient[:L] | specdec[:beta=B,tau=T]; None picks the lossless
            one for the temperature.
        pearl: PEARL's window and ablations (method pearl only).
        target: a local HF folder; None is the embedded default.
        dtype: the models' dtype.
        threads: torch CPU threads (None: torch's choice).
        runtime: auto | native | hf, the forward that runs the models (runtime/choose.py).
        device: auto | cpu | cuda.
        graphs: static shapes for the target's forward, captured as CUDA graphs on CUDA: auto (on
            CUDA), on (a CPU runs the same static shapes eagerly: for tests), off.
        quantize: the target's weights: auto | none | int8 | w8a8 | w4a8 | int4[:G] | gguf (runtime/quant/modes.py);
            auto (the default) runs a GGUF-born target's own blocks (`defaults.auto_weights`); a quantized
            target is a different model, and speculation is lossless with respect to it.
        drafter_stages: `drafter` parsed (once, here; empty for a method without a drafter, or for
            auto until the Engine resolves it).
        quant: `quantize` parsed (once, here): what the engine and the runtime read (none for auto
            until the Engine resolves it).
    """

    method: str = "sd"
    drafter: str = AUTO
    draft: DraftConfig = field(default_factory=DraftConfig)
    verifier: str | None = None
    pearl: PearlConfig = field(default_factory=PearlConfig)
    target: str | None = None
    dtype: str = "bfloat16"
    threads: int | None = None
    runtime: str = "auto"
    device: str = "auto"
    quantize: str = AUTO
    graphs: str = "auto"
    drafter_stages: tuple[DrafterSpec, ...] = field(init=False, repr=False, compare=False)
    quant: QuantSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise QuickdraftError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        # a bad spec is refused here, before any model loads
        uses = METHODS[self.method].uses_drafter and self.drafter != AUTO
        stages = parse_drafter_spec(self.drafter) if uses else ()
        object.__setattr__(self, "drafter_stages", stages)
        if self.dtype not in DTYPES:
            raise QuickdraftError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise QuickdraftError(f"threads must be >= 1, got {self.threads}")
        if self.runtime not in RUNTIMES:
            raise QuickdraftError(f"unknown runtime {self.runtime!r}; choose one of {', '.join(RUNTIMES)}")
        resolve_device(self.device)  # cuda without CUDA: refused here, before any model loads
        if self.graphs not in ("auto", "on", "off"):
            raise QuickdraftError(f"unknown graphs setting {self.graphs!r}; choose auto, on or off")
        quant = parse_quantize("none" if self.quantize == AUTO else self.quantize)
        object.__setattr__(self, "quant", quant)
        if quant.active and forces_reference(self.runtime):
            raise QuickdraftError(f"--quantize {quant} needs the native runtime (not --runtime hf)")

    def with_stages(self, stages: tuple[DrafterSpec, ...]) -> EngineConfig:
        """This config drafting with parsed `stages` (their typed values kept, not parsed again from
        text); `drafter` is their text, for the statistics and the logs."""
        new = dataclasses.replace(self, drafter=AUTO)
        object.__setattr__(new, "drafter", "+".join(map(str, stages)))
        object.__setattr__(new, "drafter_stages", tuple(stages))
        return new


@dataclass(frozen=True)
class RequestOptions:
    """What one request sets (per-request options: they never key, rebuild or reload an engine).

    Attributes:
        sampling: temperature (0 = greedy), top-k, top-p and seed.
        max_new_tokens: the budget of generated tokens.
        stop: strings that end the generation (the text is cut before them).
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.stop_config(())  # validates the budget and the stop strings

    def stop_config(self, eos_token_ids: tuple[int, ...]) -> StopConfig:
        """When the request's generation ends, given the target's EOS ids."""
        return StopConfig(self.max_new_tokens, tuple(eos_token_ids), tuple(self.stop))
