"""OpenVINO GenAI as a peer in the bench (`openvino`): plain greedy decoding of the target's GGUF through
its `LLMPipeline` and its own GGUF reader, fed what our methods are fed (the prompt ids, the budget, the
EOS ids, the threads; the prefill timed by its own time to the first token). It runs in a child process
(`bench/openvino_worker.py`): a runtime that dies on this host fails this method with one line.

`openvino:lookup=N` runs its prompt lookup instead (a pipeline made with `prompt_lookup`, N tokens
drafted a step from 3-grams of the prompt and output): its forwards and the tokens they kept come from
the pipeline's own count of tokens a step (`m_batch_sizes`); it drafts N a step, but reports neither
how many drafts it made nor how many tokens they held, so no acceptance rate is shown for it.

Needs the optional extra `openvino` (`pip install -e ".[openvino]"`: openvino-genai, about 70 MB of
wheels). Where it is missing or its reader refuses the file (the 0.5B's Q5_0 blocks were refused on an
Intel Xeon), the method is skipped with one line. Its draft-model speculation is not run: its draft
must be an OpenVINO folder, and the 0.5B ships as a GGUF only (converting it needs optimum-intel and a
float copy of the model: not done offline here).
"""

from __future__ import annotations

from pathlib import Path

from quickdraft.bench.gguf_peer import GgufPeer
from quickdraft.errors import QuickdraftError
from quickdraft.weights.loading import LoadedModel


class OpenVinoMethod(GgufPeer):
    """Plain decoding (or prompt lookup: `lookup`) by OpenVINO GenAI on the target's own GGUF, in a child process."""

    module, package, extra = "openvino_genai", "openvino-genai", "openvino"
    worker = Path(__file__).with_name("openvino_worker.py")

    def __init__(self, spec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        self.lookup = lookup_tokens(spec)
        self.speculative = self.lookup > 0
        super().__init__(spec, target, dtype, runtime, quantize)

    def load_fields(self, target: LoadedModel) -> dict:
        """The bench's threads, and prompt lookup's tokens a step (0: plain)."""
        return {**super().load_fields(target), "lookup": self.lookup}


def lookup_tokens(spec) -> int:
    """The `lookup=N` key: tokens drafted a step (0 when absent); a clear error when not a count >= 1."""
    text = spec.get("lookup")
    if text is None:
        return 0
    if not text.isdigit() or int(text) < 1:
        raise QuickdraftError(f"{spec.text}: lookup must be an integer >= 1")
    return int(text)
