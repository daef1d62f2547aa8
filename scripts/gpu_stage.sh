#!/usr/bin/env bash
# Stage what a GPU session's device calls carry (docs/gpu.md), here, from the repository root:
#
#   bash scripts/gpu_stage.sh            # .gpu/a and .gpu/b (ignored by git), sizes printed
#
# A device call carries the working tree plus the paths named in `carry`, 64 MiB in all, and the
# machine keeps ignored files between calls while it stays warm (30 s after a call). So:
#   call 1: carry [".gpu/a"]  (the GGUF's first part, the wheels, SHA256SUMS)
#           bash scripts/gpu_check.sh tests
#   call 2: carry [".gpu/b"]  (the GGUF's second part, the SeqKD corpus)
#           bash scripts/gpu_check.sh bench head
# gpu_check.sh joins the parts and checks the checksum before it uses them. Each part is sized so
# that the tree (git ls-files) plus the folder stays under the limit; the script says when not.
set -euo pipefail
limit=$((64 * 1024 * 1024))
py="${PYTHON:-.venv/bin/python}"
gguf=$("$py" -c "from quickdraft.models.default import _gguf_path; print(_gguf_path())")
name=$(basename "$gguf")
seqkd="${SEQKD:-../shared/data/seqkd}"
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
others=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb | tail -1 | cut -f1)
tree=$((tree + ${others:-0}))
{ chmod -R u+w .gpu 2>/dev/null || true; }; rm -rf .gpu && mkdir -p .gpu/a .gpu/b
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
(cd "$(dirname "$gguf")" && sha256sum "$name") >.gpu/a/SHA256SUMS
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .gpu/a "gguf==$("$py" -c 'import importlib.metadata as m; print(m.version("gguf"))')"
cp -r --no-preserve=mode "$seqkd" .gpu/b/seqkd
room_a=$((limit - tree - $(du -sb .gpu/a | cut -f1) - 2 * 1024 * 1024))  # 2 MiB of slack
size=$(stat -c %s "$gguf")
if [ "$room_a" -le 0 ]; then echo "the tree ($tree bytes) leaves no room in a call" >&2; exit 1; fi
head -c "$room_a" "$gguf" >".gpu/a/$name.part-00"
tail -c +"$((room_a + 1))" "$gguf" >".gpu/b/$name.part-01"
for d in .gpu/a .gpu/b; do
  total=$((tree + $(du -sb "$d" | cut -f1)))
  echo "$d: $(du -sh "$d" | cut -f1) carried + tree $((tree / 1048576)) MiB = $((total / 1048576)) MiB of 64"
  [ "$total" -lt "$limit" ] || { echo "$d does not fit in one call: make the tree smaller (docs/gpu.md)" >&2; exit 1; }
done
echo "GGUF $name: $size bytes in 2 parts; checksum in .gpu/a/SHA256SUMS"
