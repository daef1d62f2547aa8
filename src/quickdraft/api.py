"""The one-call API, `quickdraft.generate`: an engine loaded on first use and kept while the options
that pick it do not change."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.engine import Engine
from quickdraft.prompts import Prompt
from quickdraft.settings.options import options_from, split_options
from quickdraft.types import GenerationResult

_LOADED: list[Engine] = []  # the one engine `generate()` keeps loaded between calls


def generate(prompts: Prompt | Sequence[Prompt], **kwargs) -> GenerationResult | list[GenerationResult]:
    """One-call API: any option of `options.OPTIONS` by name (method, drafter, draft_length,
    draft_schedule, confidence_threshold, verifier, gamma, ..., target, dtype, threads), the rest
    to `Engine.generate` (max_new_tokens, temperature, top_k, top_p, seed, stop, raw). The engine
    stays loaded while the options that pick it do not change (compared as asked: `auto` with `auto`).

    Example:
        >>> import quickdraft
        >>> out = quickdraft.generate("What is 2+2?", max_new_tokens=32)     # doctest: +SKIP
        >>> out.text, out.stats.mean_acceptance_length                      # doctest: +SKIP
    """
    engine_options, request, rest = split_options(kwargs)
    config = options_from(engine_options)
    loaded_key = _LOADED[0].requested if _LOADED else None
    if loaded_key is None or {**vars(loaded_key), "threads": None} != {**vars(config), "threads": None}:
        for engine in _LOADED:
            engine.close()
        _LOADED[:] = [Engine.load(config=config)]
    elif config.threads is not None:
        torch.set_num_threads(config.threads)
    return _LOADED[0].generate(prompts, **request, **rest)
