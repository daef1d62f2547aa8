#!/usr/bin/env bash
# The kernels' int8 tiles proven exact on Arm without an Arm machine (issue #78): cross-builds them from
# src/quickdraft/runtime/kernels/*.h without torch (QUICKDRAFT_NO_TORCH, scripts/arm/torch_free.h), once per
# Arm level with the flags the runtime builds that level with (runtime/kernels/levels.py), plus a control
# with one wrong lane, links them with scripts/arm/check.cpp and runs it under qemu-aarch64 -cpu max (which
# has sdot and smmla). Prints a line per level and tile and ends with "N passed, N failed"; exits non-zero
# on any failure or when the control is not caught.
# Needs Debian's g++-aarch64-linux-gnu and qemu-user (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX_AARCH64:-aarch64-linux-gnu-g++}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
PY=${PYTHON:-.venv/bin/python}
for tool in "$CXX" "$QEMU"; do
  command -v "$tool" >/dev/null || { echo "arm_check: $tool not found (apt-get install g++-aarch64-linux-gnu qemu-user)" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags_of() {  # the runtime's flags of an Arm level, without OpenMP (the tiles' loops run serially here)
  "$PY" -c "from quickdraft.runtime.kernels import levels; print(' '.join(f for f in levels.flags('$1', machine='aarch64') if 'openmp' not in f))"
}
KERNELS=src/quickdraft/runtime/kernels
build() {  # level, its flags, extra defines
  # shellcheck disable=SC2086
  "$CXX" -std=c++17 $2 -DQUICKDRAFT_NO_TORCH -DLEVEL="$1" ${3:-} -I"$KERNELS" -Iscripts/arm \
    -c scripts/arm/tiles.cpp -o "$out/$1.o" &
}
build scalar "$(flags_of scalar)"
build dotprod "$(flags_of dotprod)"
build i8mm "$(flags_of i8mm)"
build control "$(flags_of i8mm)" -DQUICKDRAFT_CONTROL
wait
"$CXX" -std=c++17 -O2 -static -Iscripts/arm scripts/arm/check.cpp "$out"/{scalar,dotprod,i8mm,control}.o -o "$out/check"
"$QEMU" -cpu max "$out/check"
