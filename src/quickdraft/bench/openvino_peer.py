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

from pathlib import Path

from quickdraft.bench.gguf_peer import GgufPeer


class OpenVinoMethod(GgufPeer):
    """Plain decoding by OpenVINO GenAI on the target's own GGUF, in a child process."""

    module, package, extra = "openvino_genai", "openvino-genai", "openvino"
    worker = Path(__file__).with_name("openvino_worker.py")
