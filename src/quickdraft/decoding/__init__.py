"""Decode loops. Each method object has `name`, `lossy` and
`rounds(prompt_ids, sampling, max_new_tokens, generators) -> Iterator[Round]`; `collect` applies
the end conditions and statistics."""

from quickdraft.decoding.autoregressive import Autoregressive
from quickdraft.decoding.collect import collect
from quickdraft.decoding.common import Generators
from quickdraft.decoding.vanilla import SpeculativeDecoder

__all__ = ["Autoregressive", "SpeculativeDecoder", "Generators", "collect"]
