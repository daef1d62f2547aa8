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


def kv_bytes_per_token(model: PreTrainedModel) -> int:
    """Bytes one position's keys and values take over every layer of `model` (full attention: a sliding
    window's layers are counted whole, an upper bound): 2 x layers x kv heads x head dim x the dtype's size."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * model.dtype.itemsize


def cache_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of every layer (in place).

    transformers >= 5 takes the number of positions to remove, as a negative integer.
    """
    remove = cache_length(cache) - length
    if remove > 0:
        cache.crop(-remove)
