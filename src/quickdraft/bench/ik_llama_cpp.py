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

from pathlib import Path

from quickdraft.bench.gguf_peer import GgufPeer, peer_context
from quickdraft.weights.loading import LoadedModel


class IkLlamaCppMethod(GgufPeer):
    """Plain decoding by ik_llama.cpp on the target's own GGUF, in a child process."""

    module, package, extra = "ik_llama_cpp", "ik-llama-cpp-python", "ik"
    worker = Path(__file__).with_name("ik_llama_cpp_worker.py")

    def load_fields(self, target: LoadedModel) -> dict:
        """The bench's threads and a context of the model's, at most 4,096 positions."""
        return {**super().load_fields(target), "n_ctx": peer_context(target)}
