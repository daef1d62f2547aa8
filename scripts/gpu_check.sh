#!/usr/bin/env bash
# Verify the CUDA path on a machine with a GPU (docs/gpu.md). Run from the repository root there:
#
#   bash scripts/gpu_check.sh tests              # the GPU tests (tiny in-process models, no weights)
#   bash scripts/gpu_check.sh bench head         # quick CUDA bench of the default model; train the head
#
# Steps (any of them, in this order; none given: all):
#   tests  pytest -m gpu tests/test_cuda.py
#   bench  `prepare` the embedded default, then bench ar, hf-ar and sd (suffix) on CUDA (--quick)
#   head   train the feature head on CUDA for $HEAD_MINUTES minutes (default 3.5), evaluate, export
#
# What travels (scripts/gpu_stage.sh makes it here): .gpu/*/ holds the default model's GGUF in parts
# (joined here and checked against SHA256SUMS), the SeqKD corpus (.gpu/*/seqkd) and the wheels the
# GPU image lacks (gguf). The image has its own torch and transformers: quickdraft runs from src/ on
# PYTHONPATH, nothing is pip-installed into it. Results go under ${OUT:-gpu-check}/ as at most 8
# files (what the device tool brings back): env.txt, tests.txt, bench.txt, bench.tgz, head.txt, head.tgz.
set -uo pipefail
out="${OUT:-gpu-check}"
mkdir -p "$out"
py="${PYTHON:-python3}"
device="${DEVICE:-cuda}"  # DEVICE=cpu rehearses the same steps on a machine without a GPU
steps="${*:-tests bench head}"
work="${GPU_WORK:-/tmp/quickdraft-gpu}"
mkdir -p "$work/site"
export QUICKDRAFT_CACHE="${QUICKDRAFT_CACHE:-$work/cache}"
export QUICKDRAFT_FAST_BLOCK=0  # the fused kernels are the CPU's: not built on the GPU machine
export PYTHONPATH="$PWD/src:$work/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
qd() { "$py" -m quickdraft.cli "$@"; }
status=0

{
  echo "# gpu_check $(date -u +%FT%TZ): $steps (device $device)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  "$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'transformers', transformers.__version__)"
  nproc
} >>"$out/env.txt" 2>&1
cat "$out/env.txt"

shopt -s nullglob
wheels=(.gpu/*/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" "${wheels[@]}" 2>&1 | tail -2
fi

gguf() {  # the GGUF, joined from its parts once and checked
  local name joined sums
  sums=(.gpu/*/SHA256SUMS)
  [ ${#sums[@]} -gt 0 ] || { echo "no GGUF parts under .gpu/ (scripts/gpu_stage.sh)" >&2; return 1; }
  name=$(awk '{print $2}' "${sums[0]}")
  joined="$work/$name"
  if [ ! -f "$joined" ]; then  # parts in name order, whichever .gpu/ folder each came in
    cat $(for p in .gpu/*/"$name".part-*; do echo "$(basename "$p") $p"; done | sort | cut -d' ' -f2) >"$joined.tmp"
    mv "$joined.tmp" "$joined"
  fi
  (cd "$work" && sha256sum -c "$OLDPWD/${sums[0]}" >&2) || { rm -f "$joined"; return 1; }
  echo "$joined"
}

if [[ " $steps " == *" tests "* ]]; then
  "$py" -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py 2>&1 | tee "$out/tests.txt"
  status=$((status | PIPESTATUS[0]))
fi

if [[ " $steps " == *" bench "* || " $steps " == *" head "* ]]; then
  QUICKDRAFT_GGUF=$(gguf) || exit 1
  export QUICKDRAFT_GGUF
  qd prepare 2>&1 | tail -3
fi

if [[ " $steps " == *" bench "* ]]; then
  qd bench --quick --device "$device" --runs 1 --batch 0 --out "$work/quick-$device" \
    --methods "ar,hf-ar,sd" ${BENCH_ARGS:-} 2>&1 | tail -40 | tee "$out/bench.txt"
  status=$((status | PIPESTATUS[0]))
  tar czf "$out/bench.tgz" -C "$work" "quick-$device"
fi

if [[ " $steps " == *" head "* ]]; then
  data=(.gpu/*/seqkd)
  [ ${#data[@]} -gt 0 ] || { echo "no SeqKD corpus under .gpu/*/seqkd" >&2; exit 1; }
  # the run folder stays on the machine; a second call resumes it (same command)
  ${HEAD_TIMEOUT:+timeout $HEAD_TIMEOUT} "$py" -m quickdraft.cli train-draft --kind head --data "${data[0]}" --output "$work/head-$device" --device "$device" \
    --steps 1000000 --minutes "${HEAD_MINUTES:-3.5}" --batch-size "${HEAD_BATCH:-64}" --lr "${HEAD_LR:-1e-3}" \
    --warmup 100 --ttt-steps "${HEAD_TTT:-2}" --checkpoint-every 500 --decode-prompts 4 --no-progress \
    ${HEAD_ARGS:-} 2>&1 | tail -30 | tee "$out/head.txt"
  status=$((status | PIPESTATUS[0]))
  tar czf "$out/head.tgz" -C "$work" --exclude store --exclude checkpoint.pt "head-$device"
fi
exit "$status"
