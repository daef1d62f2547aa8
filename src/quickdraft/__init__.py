"""quickdraft: speculative decoding for Hugging Face causal LMs, lossless and measured.

Glossary (used everywhere in this package):
    p        the target model's processed next-token distribution (the model whose output we keep).
    q        the draft's processed distribution; drafts are sampled from exactly q.
    gamma/k  the number of draft tokens proposed in one round (`num_draft_tokens`).
    bonus    the extra token drawn from p after all k drafts are accepted; after a rejection the
             "correction" token is drawn from norm(max(0, p - q)) instead.
    round    one draft -> verify -> commit/rollback cycle = one target forward.

Public API: `generate`, `Engine`, `EngineConfig` and the config/result dataclasses.
"""

from quickdraft.api import generate
from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.engine import Engine, EngineConfig
from quickdraft.errors import QuickdraftError
from quickdraft.types import GenerationResult, Round, SpecStats, Verdict
from quickdraft.verifiers.tree import TokenTree

__version__ = "0.1.0"

__all__ = [
    "DraftConfig",
    "Engine",
    "EngineConfig",
    "GenerationResult",
    "TokenTree",
    "QuickdraftError",
    "Round",
    "SamplingConfig",
    "SpecStats",
    "StopConfig",
    "Verdict",
    "generate",
]
