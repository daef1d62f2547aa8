"""A peer runtime's plain greedy decoding of the target's own GGUF, in a child process (`GgufPeer`): what
`ik-llama-cpp` (`ik_llama_cpp_peer.py`) and `openvino` (`openvino_peer.py`) share. It is fed what
our methods are fed (the prompt ids, the budget, the EOS ids, the threads; the prefill timed). The peer
is an optional extra: where its package is missing or it cannot load the file, the method is skipped
with one line (`PeerSkipped`); a worker that dies fails it with one line (`PeerCrashed`).
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

from quickdraft.bench.outputs import RunOutput
from quickdraft.bench.peers.child import ChildPeer, PeerCrashed, PeerSkipped
from quickdraft.errors import QuickdraftError
from quickdraft.weights.loading import LoadedModel

PEER_CONTEXT = 4096  # the context a peer loads with unless a bench's prompts need more
_needed = [0]  # the positions the running bench's longest prompt and answer take (`sized_for`)


@contextlib.contextmanager
def sized_for(positions: int):
    """Peers built inside load a context of at least `positions` (a bench's longest prompt plus its new
    tokens), so an 8k-31k-token prompt runs on them as on ours."""
    _needed[0] = positions
    try:
        yield
    finally:
        _needed[0] = 0


def peer_context(target: LoadedModel) -> int:
    """The context a peer loads the target with: PEER_CONTEXT, or what the bench's prompts need
    (`sized_for`), at most the model's."""
    limit = int(getattr(target.model.config, "max_position_embeddings", PEER_CONTEXT))
    return min(limit, max(PEER_CONTEXT, _needed[0]))


class GgufPeer:
    """Plain decoding by a peer runtime on the target's own GGUF, in a child process.

    Subclasses name `module` (the package the worker imports, found here without importing it),
    `package` and `extra` (what installs it) and `worker` (the script run by path), and may add to the
    worker's load request (`load_fields`).
    """

    speculative = False
    module: str
    package: str
    extra: str
    worker: Path

    def __init__(self, spec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        if importlib.util.find_spec(self.module) is None:  # an optional peer: skipped, never fatal
            raise PeerSkipped(
                f'{spec.text}: skipped: {self.package} is not installed (pip install -e ".[{self.extra}]")'
            )
        if target.gguf is None:
            raise QuickdraftError(f"{spec.text}: the target {target.name} was not loaded from a GGUF file")
        self.spec = spec
        self.eos = sorted(target.eos_token_ids)
        model, fields = self.model_path(target), self.load_fields(target)  # before the child: either may skip
        self.child = ChildPeer(spec.text, self.worker)
        try:
            loaded = self.child.call("load", model=str(model), **fields)
        except PeerCrashed:
            self.child.close()
            raise
        except QuickdraftError as exc:  # it could not load the model
            self.child.close()
            raise PeerSkipped(f"skipped: {exc}") from None
        self.system_info = loaded["system_info"]

    def model_path(self, target: LoadedModel) -> Path:
        """The file the worker loads: the target's own GGUF."""
        return target.gguf

    def load_fields(self, target: LoadedModel) -> dict:
        """What the worker's load request carries besides the model's path: the bench's threads."""
        import torch

        return {"threads": torch.get_num_threads()}

    @property
    def weights(self) -> str:
        return f"{self.spec.name}:gguf"

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunOutput:
        got = self.child.call("run", prompt=list(prompt_ids), max_new_tokens=max_new_tokens, eos=self.eos)
        out = RunOutput(got["tokens"], got["wall_s"], got["forwards"], prefill_s=got.get("prefill_s"))
        out.num_accepted = got.get("accepted", 0)  # a speculating peer's draft tokens kept
        return out

    def close(self) -> None:
        self.child.close()
