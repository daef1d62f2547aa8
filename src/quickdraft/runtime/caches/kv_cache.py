"""The only code that knows Hugging Face cache formats: create, measure and crop a cache."""

from __future__ import annotations

from transformers import DynamicCache, PreTrainedModel

from quickdraft.errors import QuickdraftError


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty cache for `model`; refuses models whose cache cannot be rolled back."""
    cache = DynamicCache(config=model.config)
    if not cache.is_croppable:
        raise QuickdraftError(
            f"{model.config.model_type}: its KV cache (sliding-window or recurrent layers) cannot be "
            "rolled back, so speculative decoding is refused for this model"
        )
    return cache


def cache_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of every layer (in place).

    transformers >= 5 takes the number of positions to remove, as a negative integer.
    """
    remove = cache_length(cache) - length
    if remove > 0:
        cache.crop(-remove)
