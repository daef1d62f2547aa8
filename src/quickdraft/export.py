"""`quickdraft export --to vllm`: the vLLM `speculative_config` equivalent to a quickdraft drafter.

Each drafter kind's mapping is its record's `export` (`drafters/kinds.py`): ngram -> "ngram",
suffix -> "suffix", model:PATH -> "draft_model", truncated:N -> "draft_model" over the folder the
caller saved it to; the others have no vLLM equivalent and are refused by name.
"""

from __future__ import annotations

from collections.abc import Sequence

from quickdraft.drafters.kinds import KINDS, DrafterSpec
from quickdraft.errors import QuickdraftError


def vllm_speculative_config(stages: Sequence[DrafterSpec], num_draft_tokens: int, draft_dir: str | None = None) -> dict:
    """vLLM's speculative_config for a parsed drafter spec (`drafters/spec.py`, parsed at the edge; one
    stage: vLLM has no fallback chains); `draft_dir` is where the caller saved a copied draft
    (truncated:N) as an ordinary HF folder."""
    if num_draft_tokens < 1:
        raise QuickdraftError(f"draft length must be >= 1, got {num_draft_tokens}")
    drafter = "+".join(map(str, stages))
    if len(stages) > 1:
        raise QuickdraftError(f"drafter {drafter!r}: vLLM has no fallback chains; export one drafter")
    spec = stages[0]
    export = KINDS[spec.kind].export
    if export is None:
        able = ", ".join(k.usage for k in KINDS.values() if k.export is not None)
        raise QuickdraftError(f"drafter {drafter!r} has no vLLM equivalent (exportable: {able})")
    return export(spec, num_draft_tokens, draft_dir)
