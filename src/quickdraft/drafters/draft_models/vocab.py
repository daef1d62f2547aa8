"""A self-draft's LM head restricted to the K most frequent ids of the target's text: `;vocab=K`
after a self-draft's argument (`truncated:N;vocab=K`, `quant:MODE;vocab=K`).

A self-draft keeps the target's whole LM head, and on a large vocabulary that head is most of its
step (Gemma 3 270M: 168M of its 268M parameters are the tied 262k x 640 head). Restricted to K ids,
the draft multiplies only those K rows and its q is 0 elsewhere, so the acceptance rule stays
lossless (a token outside the K ids is never drafted; the target still emits it). The ids are
ranked once per target by their frequency in the SeqKD prompts and responses (ShareGPT prompts and
SmolLM2's answers: never the benchmark sets), re-encoded with the target's tokenizer
(`scripts/rank_vocab.py`), and shipped as `assets/vocab/KEY/ranked_ids.safetensors`; `;vocab=PATH`
takes such a file (every id it ranks) for any other target.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from quickdraft.drafters.kinds import ASSETS as ALL_ASSETS
from quickdraft.errors import QuickdraftError
from quickdraft.spec_options import parse_options, text
from quickdraft.weights.delta import SHIPPED_FOR

ASSETS = ALL_ASSETS / "vocab"
RANKED = "ranked_ids.safetensors"
ALL = "all"  # `;vocab=all`: the whole head (where a default would restrict it)
# target name -> its ranking's folder under assets/vocab: the shipped drafts' targets, and Gemma
VOCAB_FOR = {
    **SHIPPED_FOR,
    "gemma-3-270m": "gemma-3-270m",
    "Qwen2.5-Coder-1.5B-Instruct": "qwen2.5-coder",  # one tokenizer for the pair
    "Qwen2.5-Coder-0.5B-Instruct": "qwen2.5-coder",
}


def vocab_value(value: str) -> str:
    """`;vocab=`'s value: K >= 1 (a head of the K most frequent ids), "all" or a ranking file's PATH."""
    if value.isdigit() and int(value) < 1:
        raise ValueError("K >= 1, all or a PATH")
    return value


# the options of the model-backed kinds, each once: {name: converter} (spec_options.py)
MODEL_OPTION_TYPES = {"quant": text, "vocab": vocab_value, "window": text}


def split_options(kind: str, arg: str | None, allowed: tuple[str, ...]) -> tuple[str | None, dict[str, str]]:
    """(the kind's own argument, {option: value}) of `ARG[;KEY=VALUE]...` with KEY in `allowed`."""
    return parse_options(f"drafter '{kind}:{arg}'", arg, {name: MODEL_OPTION_TYPES[name] for name in allowed})


def split_vocab(kind: str, arg: str | None) -> tuple[str | None, str | None]:
    """(the kind's own argument, the `vocab` value) of `ARG[;vocab=K|PATH]`; a bad option is refused."""
    main, values = parse_options(f"drafter '{kind}:{arg}'", arg, {"vocab": vocab_value})
    return main, values.get("vocab")


def ranked_ids(target_name: str | None, value: str) -> torch.Tensor | None:
    """(R,) int64 token ids, most frequent first: the ranking shipped for the target (`value` a
    number; None when none ships), or the one in the file `value` names."""
    if value.isdigit():
        key = VOCAB_FOR.get(target_name or "")
        if key is None or not (ASSETS / key / RANKED).is_file():
            return None  # none ships: ranked by content (drafters/draft_models/ranking.py)
        path = ASSETS / key / RANKED
    else:
        path = Path(value).expanduser()
        path = path / RANKED if path.is_dir() else path
        if not path.is_file():
            raise QuickdraftError(f";vocab={value}: no such ranking file (scripts/rank_vocab.py writes one)")
    return load_file(str(path))["ranked"].to(torch.long)


def restricted_head(target, value: str | None) -> torch.Tensor | None:
    """(K,) sorted int64 ids a self-draft's head keeps for `;vocab=VALUE` (None: the whole head): the
    ranking's first K and the target's EOS ids."""
    if value is None or value == ALL:
        return None
    ranked = ranked_ids(target.name, value)
    if ranked is None:  # no ranking ships for this target: its tokenizer's, made from shipped text
        from quickdraft.drafters.draft_models.ranking import ranked_for

        ranked = ranked_for(target.tokenizer)
    if int(ranked.max()) >= target.vocab_size:
        raise QuickdraftError(f";vocab={value}: the ranking holds ids beyond the target's {target.vocab_size}")
    keep = ranked[: int(value)] if value.isdigit() else ranked
    eos = torch.tensor(target.eos_token_ids, dtype=torch.long)  # a draft that can end the turn (a ranking of
    return torch.cat([keep, eos[eos < target.vocab_size]]).unique()  # another model's answers may lack the EOS)
