"""ik_llama.cpp as a peer in the bench (`ik-llama-cpp`): plain greedy decoding of the target's GGUF through
ik-llama-cpp-python (module `ik_llama_cpp`, so it sits beside llama-cpp-python), fed what our methods
are fed (the prompt ids, the budget, the threads; the prefill timed). It runs in a child process
(`bench/ik_llama_cpp_worker.py`): a build that dies on this host fails this method with one line.

Needs the optional extra `ik` (`pip install -e ".[ik]"`). Its PyPI wheel is built for AVX2 and its sdist
misses a build script; `python scripts/install_ik_llama_cpp.py` builds it for this host's instruction
sets (about 10 minutes on 2 cores). The report's builds line shows which instruction sets the loaded
build has.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from quickdraft.bench.outputs import RunOutput
from quickdraft.bench.peer_process import ChildPeer, PeerCrashed, PeerSkipped
from quickdraft.errors import QuickdraftError
from quickdraft.weights.loading import LoadedModel

WORKER = Path(__file__).with_name("ik_llama_cpp_worker.py")


class IkLlamaCppMethod:
    """Plain decoding by ik_llama.cpp on the target's own GGUF, in a child process."""

    speculative = False

    def __init__(self, spec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        import torch

        if importlib.util.find_spec("ik_llama_cpp") is None:  # an optional peer: skipped, never fatal
            raise PeerSkipped(f'{spec.text}: skipped: ik-llama-cpp-python is not installed (pip install -e ".[ik]")')
        if target.gguf is None:
            raise QuickdraftError(f"{spec.text}: the target {target.name} was not loaded from a GGUF file")
        self.spec = spec
        self.eos = sorted(target.eos_token_ids)
        context = min(int(getattr(target.model.config, "max_position_embeddings", 4096)), 4096)
        self.child = ChildPeer(spec.text, WORKER)
        try:
            loaded = self.child.call("load", model=str(target.gguf), n_ctx=context, threads=torch.get_num_threads())
        except PeerCrashed:
            self.child.close()
            raise
        except QuickdraftError as exc:  # it could not load the model
            self.child.close()
            raise PeerSkipped(f"skipped: {exc}") from None
        self.system_info = loaded["system_info"]

    @property
    def weights(self) -> str:
        return "ik-llama-cpp:gguf"

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> RunOutput:
        got = self.child.call("run", prompt=list(prompt_ids), max_new_tokens=max_new_tokens, eos=self.eos)
        return RunOutput(got["tokens"], got["wall_s"], got["forwards"], prefill_s=got.get("prefill_s"))

    def close(self) -> None:
        self.child.close()
