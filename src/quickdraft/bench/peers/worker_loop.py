"""The loop every peer's child process runs (`llama_cpp_worker.py`, `ik_llama_cpp_worker.py`,
`openvino_worker.py`): one JSON request a line on stdin, `{"op": NAME, ...fields}`, answered by the
peer's method of that name with one JSON reply a line on the original stdout; {"op": "close"} ends it.

A worker runs by path, so it imports the standard library, this file (found beside it) and its peer's
own package only, never quickdraft nor torch. Its folder is then first on the import path, so no file
here is named as a package is (`tests/test_peer_process.py` checks it): `llama_cpp_peer.py`, not
`llama_cpp.py`.
"""

from __future__ import annotations

import json
import os
import sys


def serve(peer, requests, replies) -> None:
    """Answer `requests` (lines of JSON) on `replies` until "close" or the end of input."""
    for line in requests:
        request = json.loads(line)
        op = request.pop("op")
        if op == "close":
            break
        try:
            reply = getattr(peer, op)(**request)
        except Exception as exc:  # a Python-level failure: reported, the process lives on
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(peer) -> None:
    """Serve `peer` on this process's stdin and stdout; whatever the peer's library prints goes to stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")  # the protocol keeps the real stdout
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(peer, sys.stdin, replies)
