"""`quickdraft export --to vllm`: the vLLM `speculative_config` equivalent to a quickdraft drafter."""

from __future__ import annotations

from pathlib import Path

from quickdraft.drafters.spec import ngram_sizes, parse_drafter_spec
from quickdraft.errors import QuickdraftError


def vllm_speculative_config(drafter: str, num_draft_tokens: int, draft_dir: str | None = None) -> dict:
    """vLLM's speculative_config for a drafter spec.

    ngram[:N[:M]] -> method "ngram" (prompt_lookup_max N, prompt_lookup_min M, default 3 and 1);
    model:PATH -> method "draft_model"; a "+" chain has no equivalent and is refused;
    truncated:N has no vLLM equivalent as such: pass `draft_dir`, where the caller saved the
    truncated draft as an ordinary HF folder, and it becomes a draft_model; suffix -> method
    "suffix" (vLLM's SuffixDecoding: its global tree grows from the requests it serves, so our
    offline datastore has no equivalent there and is not exported).
    """
    if num_draft_tokens < 1:
        raise QuickdraftError(f"draft length must be >= 1, got {num_draft_tokens}")
    stages = parse_drafter_spec(drafter)
    if len(stages) > 1:
        raise QuickdraftError(f"drafter {drafter!r}: vLLM has no fallback chains; export one drafter")
    spec = stages[0]
    if spec.kind == "ngram":
        longest, shortest = ngram_sizes(spec.arg)
        return {
            "method": "ngram",
            "num_speculative_tokens": num_draft_tokens,
            "prompt_lookup_max": longest,
            "prompt_lookup_min": shortest,
        }
    if spec.kind == "suffix":
        from quickdraft.drafters.spec import parse_suffix

        options = parse_suffix(spec.arg)[1]
        return {
            "method": "suffix",
            "num_speculative_tokens": num_draft_tokens,
            "suffix_decoding_max_tree_depth": options.get("depth", 8),
        }
    if spec.kind == "model":
        return {
            "method": "draft_model",
            "model": str(Path(spec.arg).expanduser().resolve()),
            "num_speculative_tokens": num_draft_tokens,
        }
    if spec.kind == "truncated":
        if draft_dir is None:
            raise QuickdraftError("a truncated draft must be saved for vLLM: add --draft-out DIR")
        return {
            "method": "draft_model",
            "model": str(Path(draft_dir).resolve()),
            "num_speculative_tokens": num_draft_tokens,
        }
    raise QuickdraftError(
        f"drafter {drafter!r} has no vLLM equivalent (exportable: ngram, suffix, model:PATH, truncated:N)"
    )
