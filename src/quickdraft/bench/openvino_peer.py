"""OpenVINO GenAI as a peer in the bench (`openvino`): plain greedy decoding of the target's GGUF through
its `LLMPipeline` and its own GGUF reader, fed what our methods are fed (the prompt ids, the budget, the
EOS ids, the threads; the prefill timed by its own time to the first token). It runs in a child process
(`bench/openvino_worker.py`): a runtime that dies on this host fails this method with one line.

Needs the optional extra `openvino` (`pip install -e ".[openvino]"`: openvino-genai, about 70 MB of
wheels). Where it is missing or its reader refuses the file (the 0.5B's Q5_0 blocks were refused on an
Intel Xeon), the method is skipped with one line. Its prompt lookup and draft-model speculation are not
run here yet (its draft must be an OpenVINO folder).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from quickdraft.bench.outputs import RunOutput
from quickdraft.bench.peer_process import ChildPeer, PeerCrashed, PeerSkipped
from quickdraft.errors import QuickdraftError
from quickdraft.weights.loading import LoadedModel

WORKER = Path(__file__).with_name("openvino_worker.py")


class OpenVinoMethod:
    """Plain decoding by OpenVINO GenAI on the target's own GGUF, in a child process."""

    speculative = False

    def __init__(self, spec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        import torch

        if importlib.util.find_spec("openvino_genai") is None:  # an optional peer: skipped, never fatal
            raise PeerSkipped(f'{spec.text}: skipped: openvino-genai is not installed (pip install -e ".[openvino]")')
        if target.gguf is None:
            raise QuickdraftError(f"{spec.text}: the target {target.name} was not loaded from a GGUF file")
        self.spec = spec
        self.eos = sorted(target.eos_token_ids)
        self.child = ChildPeer(spec.text, WORKER)
        try:
            loaded = self.child.call("load", model=str(target.gguf), threads=torch.get_num_threads())
        except PeerCrashed:
            self.child.close()
            raise
        except QuickdraftError as exc:  # it could not load the model
            self.child.close()
            raise PeerSkipped(f"skipped: {exc}") from None
        self.system_info = loaded["system_info"]

    @property
    def weights(self) -> str:
        return "openvino:gguf"

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunOutput:
        got = self.child.call("run", prompt=list(prompt_ids), max_new_tokens=max_new_tokens, eos=self.eos)
        return RunOutput(got["tokens"], got["wall_s"], got["forwards"], prefill_s=got.get("prefill_s"))

    def close(self) -> None:
        self.child.close()
