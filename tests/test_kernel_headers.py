"""The kernels' headers (issue #68 item 4): each beside its Python wrapper of the same stem (the quantized
forms' wrappers in their own room, `runtime/quant/`, issue #80), the shared
ground in its own headers, and every header self-contained (it compiles alone: it includes what it
uses), with negative controls that prove the checks can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from quickdraft.runtime import kernels

KERNELS = Path(kernels.__file__).parent
QUANT = KERNELS.parent / "quant"  # the quantized forms' wrappers: w8a8, w4a8, w6a8, q4k
SHARED = {"common.h", "int8_dots.h", "int8_rows.h"}  # the shared ground: no wrapper of their own


def unpaired_headers(folder: Path, rooms: tuple[Path, ...] = ()) -> list[str]:
    """Headers in `folder` with no Python wrapper of the same stem beside them or in `rooms` (the shared
    ground aside)."""
    return sorted(
        h.name
        for h in folder.glob("*.h")
        if h.name not in SHARED and not any((d / f"{h.stem}.py").exists() for d in (folder, *rooms))
    )


def test_every_header_is_beside_its_wrapper():
    assert unpaired_headers(KERNELS, (QUANT,)) == []
    assert [h for h in ("w8a8", "w4a8", "w6a8", "q4k") if not (QUANT / f"{h}.py").exists()] == []
    assert {h.name for h in KERNELS.glob("*.h")} >= SHARED | {"w8a8.h", "q4k.h", "block_ops.h", "attention.h"}


def test_an_unpaired_header_is_found(tmp_path):  # negative control
    (tmp_path / "a.h").write_text("")
    (tmp_path / "b.h").write_text("")
    (tmp_path / "b.py").write_text("")
    assert unpaired_headers(tmp_path) == ["a.h"]


def test_the_translation_unit_includes_every_part():
    text = (KERNELS / "fused.cpp").read_text()
    included = {line.split('"')[1] for line in text.splitlines() if line.startswith('#include "')}
    assert included | SHARED == {h.name for h in KERNELS.glob("*.h")}
    assert "namespace {" not in text  # the parts own their scope; the unit only binds them


def compile_alone(header: Path) -> str:
    """The compiler's error output for a translation unit that includes only `header` ("" when it compiles)."""
    from torch.utils.cpp_extension import include_paths

    flags = [f"-I{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]
    unit = f'#include "{header}"\n'
    run = subprocess.run(
        ["c++", "-std=c++17", "-fsyntax-only", *kernels.flags("scalar"), *flags, "-x", "c++", "-"],
        input=unit, capture_output=True, text=True,
    )  # fmt: skip
    return "" if run.returncode == 0 else run.stderr


needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")


@pytest.mark.slow
@needs_compiler
def test_every_header_compiles_alone():
    headers = sorted(KERNELS.glob("*.h"))
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # a compile each, side by side (about 15 s each)
        errors = dict(zip((h.name for h in headers), pool.map(compile_alone, headers), strict=True))
    assert {name: e for name, e in errors.items() if e} == {}


@pytest.mark.slow
@needs_compiler
def test_a_header_that_misses_an_include_fails_alone(tmp_path):  # negative control
    text = (KERNELS / "w8a8.h").read_text().replace('#include "int8_rows.h"\n', "")
    (tmp_path / "w8a8.h").write_text(text)
    assert "error" in compile_alone(tmp_path / "w8a8.h")
