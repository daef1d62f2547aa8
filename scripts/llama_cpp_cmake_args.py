"""The CMake arguments that build llama-cpp-python (the bench's llama.cpp peer) for this CPU, printed
on one line for `CMAKE_ARGS="$(python3 scripts/llama_cpp_cmake_args.py)" pip install ...` (README).

llama.cpp's default `-march=native` build turns on every instruction set the compiler sees, AMX
included, and on an Intel Xeon virtual machine with AMX its first decode died on an AMX `tilezero`
(SIGILL, issue #47). This build names what it uses instead: `GGML_NATIVE=OFF`, then AVX, AVX2, FMA,
F16C, BMI2, AVX-VNNI and the AVX-512 sets this CPU reports in /proc/cpuinfo, with AMX off. On a host
without AMX that is the same code as the native build; elsewhere it is what runs. Standard library
only: it runs before anything is installed.

    python3 scripts/llama_cpp_cmake_args.py            # this host
    python3 scripts/llama_cpp_cmake_args.py --flags "avx2 fma f16c"   # another host's flags
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

_FILE = Path(__file__).resolve().parents[1] / "src" / "quickdraft" / "bench" / "peers" / "llama_cmake.py"
_SPEC = importlib.util.spec_from_file_location("llama_cmake", _FILE)
llama_cmake = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(llama_cmake)  # by its path: no package import (nothing is installed yet)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flags", default=None, help="space-separated CPU flags (default: this host's)")
    args = parser.parse_args()
    flags = set(args.flags.split()) if args.flags is not None else llama_cmake.host_flags()
    print(" ".join(llama_cmake.cmake_args(flags)))


if __name__ == "__main__":
    main()
