"""OpenVINO GenAI as a peer in the bench (`openvino`): plain greedy decoding of the target's GGUF through
its `LLMPipeline` and its own GGUF reader, fed what our methods are fed (the prompt ids, the budget, the
EOS ids, the threads; the prefill timed by its own time to the first token). It runs in a child process
(`bench/peers/openvino_worker.py`): a runtime that dies on this host fails this method with one line.

Its speculation, each compared with its plain decoding (its forwards and the draft tokens they kept
come from the pipeline's own count of tokens a step, `m_batch_sizes`; it reports neither how many
drafts it made nor how many tokens they held, so no acceptance rate is shown for it):
- `openvino:lookup=N`: prompt lookup, N tokens drafted a step from 3-grams of the prompt and output;
- `openvino:draft=NAME|FILE.gguf[,draft_max=N]`: draft-model speculation, N tokens drafted a step
  (default 5, its own). Its draft must be an OpenVINO folder: the draft's GGUF is requantized to Q8_0
  by llama.cpp's quantizer (its reader refuses the 0.5B's Q5_0 blocks; Q8_0 and Q4_0 are the forms its
  guide names) and converted once, offline, by its own GGUF reader (`enable_save_ov_model`), into the
  quickdraft cache (`openvino_draft`). The requantizing needs the `peers` extra.

Needs the optional extra `openvino` (`pip install -e ".[openvino]"`: openvino-genai, about 70 MB of
wheels). Where it is missing or its reader refuses the file, the method is skipped with one line.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from quickdraft.bench.peers.child import PeerSkipped
from quickdraft.bench.peers.gguf_peer import GgufPeer
from quickdraft.errors import QuickdraftError
from quickdraft.host import cache_dir
from quickdraft.weights.loading import LoadedModel

DRAFT_QUANT = "q8_0"  # the draft's GGUF form OpenVINO's reader takes (the 0.5B's own Q5_0 it refuses)


class OpenVinoMethod(GgufPeer):
    """Plain decoding, prompt lookup (`lookup`) or draft-model speculation (`draft`) by OpenVINO GenAI on
    the target's own GGUF, in a child process."""

    module, package, extra = "openvino_genai", "openvino-genai", "openvino"
    worker = Path(__file__).with_name("openvino_worker.py")

    def __init__(self, spec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        self.lookup, self.draft_max = count_key(spec, "lookup", 0), count_key(spec, "draft_max", 5)
        name = spec.get("draft")
        if name is not None and self.lookup:
            raise QuickdraftError(f"{spec.text}: lookup and draft are two ways to draft: choose one")
        if name is None and spec.get("draft_max") is not None:
            raise QuickdraftError(f"{spec.text}: draft_max needs draft=")
        self.draft = None
        if name is not None:
            from quickdraft.bench.peers.llama_spec_peer import draft_gguf

            self.draft = draft_gguf(name, "openvino")
        self.speculative = bool(self.lookup or self.draft)
        super().__init__(spec, target, dtype, runtime, quantize)

    def load_fields(self, target: LoadedModel) -> dict:
        """The bench's threads, prompt lookup's tokens a step (0: none), and the draft's OpenVINO folder
        with its tokens a step (made here the first time: `openvino_draft`)."""
        fields = {**super().load_fields(target), "lookup": self.lookup}
        if self.draft is not None:
            fields.update(draft_folder=str(openvino_draft(self.draft, self.spec.text)), draft_max=self.draft_max)
        return fields


def count_key(spec, key: str, default: int) -> int:
    """A key that counts tokens (`lookup=N`, `draft_max=N`): `default` when absent; one clear line when
    not an integer >= 1."""
    text = spec.get(key)
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise QuickdraftError(f"{spec.text}: {key} must be an integer >= 1")
    return int(text)


def openvino_draft(gguf: Path, label: str) -> Path:
    """The folder OpenVINO's draft is read from: the draft's GGUF requantized to DRAFT_QUANT (llama.cpp's
    quantizer, cached) and linked in as `model.gguf`, which the worker converts on its first load (its
    IR and tokenizers written beside it). A missing quantizer is a one-line skip."""
    from quickdraft.bench.peers.llama_cpp_peer import quantized_copy

    folder = cache_dir() / "openvino" / f"{gguf.stem}-{gguf.stat().st_size}-{DRAFT_QUANT}"
    if (folder / "openvino_model.xml").is_file():
        return folder
    try:
        copy = quantized_copy(gguf, DRAFT_QUANT)
    except QuickdraftError as exc:  # llama-cpp-python (the peers extra) requantizes it
        raise PeerSkipped(f"{label}: skipped: its draft needs a {DRAFT_QUANT} copy: {exc}") from None
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "model.gguf").exists():
        try:
            os.link(copy, folder / "model.gguf")
        except OSError:
            shutil.copy(copy, folder / "model.gguf")
    return folder
