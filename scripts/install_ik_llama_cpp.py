"""Install the `ik` extra's ik-llama-cpp-python built for this host (the bench's `ik-llama-cpp` peer).

Its PyPI wheel is built for AVX2 only, and its sdist (0.1.5) cannot build as shipped: it lacks
`vendor/ik_llama.cpp/common/cmake/build-info-gen-cpp.cmake`, the script its build runs to write
common/build-info.cpp, so the build stops there ("Error processing file"). This downloads the sdist
from the package index, adds that script (llama.cpp's: build-info.cpp from its template, the build's
details from cmake/build-info.cmake) and builds it with `-DGGML_NATIVE=ON` (this CPU's instruction
sets) into the running Python's environment: about 10 minutes on 2 cores.

    .venv/bin/python scripts/install_ik_llama_cpp.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "ik-llama-cpp-python==0.1.5"
GEN = """include(${CMAKE_CURRENT_SOURCE_DIR}/cmake/build-info.cmake)
set(TEMPLATE_FILE "${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp.in")
set(OUTPUT_FILE "${CMAKE_CURRENT_SOURCE_DIR}/common/build-info.cpp")
configure_file(${TEMPLATE_FILE} ${OUTPUT_FILE})
"""


def patch(tree: Path) -> bool:
    """Add the missing build-info script to an unpacked sdist; False when it was already there."""
    script = tree / "vendor/ik_llama.cpp/common/cmake/build-info-gen-cpp.cmake"
    if script.exists():
        return False
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(GEN)
    return True


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip"]
        subprocess.run([*pip, "download", "--no-deps", "--no-binary", ":all:", "-d", tmp, PACKAGE], check=True)
        sdist = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        tree = next(p for p in Path(tmp).iterdir() if p.is_dir())
        print(f"patched {tree.name}: {patch(tree)}", flush=True)
        env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", "-DGGML_NATIVE=ON")}
        subprocess.run([*pip, "install", str(tree)], check=True, env=env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
