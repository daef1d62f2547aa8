"""Run README commands in one process, as the `quickdraft` console script runs each one.

Reads a JSON list of argument lists (without the leading `quickdraft`) on stdin, calls the console
script's entry point (`quickdraft.cli:main`) on each in turn with its own captured stdout and stderr,
stops at the first that fails, and prints a JSON list of {"rc", "stdout", "stderr"}. One process
pays torch's and transformers' import once for a whole README group (about 4 s a command).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback


def run(commands: list[list[str]]) -> list[dict]:
    from quickdraft.cli import main

    results = []
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv) or 0
            except SystemExit as exc:  # argparse and commands that exit
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # a crash: its traceback is the command's stderr
                traceback.print_exc()
                rc = 1
        results.append({"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()})
        if rc != 0:
            break
    return results


if __name__ == "__main__":
    results = run(json.load(sys.stdin))
    sys.stdout.write(json.dumps(results))
