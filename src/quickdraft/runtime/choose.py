"""Choosing the forward that runs a model: the native one where it applies, Hugging Face's otherwise.

    auto    native for supported models (the Llama family), Hugging Face's for the rest (default)
    native  native, or a clear error naming why the model is not supported
    hf      always Hugging Face's forward (the reference)

Devices: `resolve_device` turns auto|cpu|cuda into the device models run on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.forward.native import unsupported_reason

RUNTIMES = ("auto", "native", "hf")
DEVICES = ("auto", "cpu", "cuda")


def cached_model(
    model,
    vocab_size: int | None = None,
    head_ids: torch.Tensor | None = None,
    runtime: str = "auto",
    linears: Mapping[str, Callable] | None = None,
):
    """The cache owner for `model` on the chosen runtime (same verbs either way); `linears` are
    kernel-form (quantized) linears by parameter name, native runtime only."""
    if runtime not in RUNTIMES:
        raise QuickdraftError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    reason = unsupported_reason(model)
    if runtime == "native" and reason is not None:
        raise QuickdraftError(f"--runtime native does not support this model: {reason} (use --runtime hf)")
    if linears and (runtime == "hf" or reason is not None):
        raise QuickdraftError(f"quantized weights need the native runtime ({reason or '--runtime hf'})")
    if runtime == "hf" or reason is not None:
        return CachedModel(model, vocab_size, head_ids)
    return NativeCachedModel(model, vocab_size, head_ids, linears)


def forces_reference(runtime: str) -> bool:
    """Whether `runtime` forces Hugging Face's forward (the reference): no quantized linears and no
    hidden states for drafters to read (the one place a runtime's name is compared)."""
    return runtime == "hf"


def resolve_device(device: str) -> str:
    """The device models run on: cpu, or cuda (auto: cuda when a CUDA device is present). cuda
    without a CUDA device is a clear error."""
    if device not in DEVICES:
        raise QuickdraftError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise QuickdraftError(f"--device cuda: no CUDA device is available (torch {torch.__version__})")
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def eager_attention() -> contextlib.AbstractContextManager:
    """A context for eager (uncaptured) calls on a GPU: SDPA without cuDNN's kernel (QUICKDRAFT_CUDNN_SDPA=1
    keeps it). cuDNN builds a plan for every new shape, and an eager drafter's shapes change every
    step (issue #50's profile: 1.24 ms of host time a call for the feature head's attention). Captured
    graphs keep cuDNN: their shapes are fixed, and with a mask and grouped-query heads the other
    kernel left is the math one (five kernels a layer, measured on the H200). Nothing on a CPU."""
    if not torch.cuda.is_available() or os.environ.get("QUICKDRAFT_CUDNN_SDPA") == "1":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
