#!/usr/bin/env bash
# The one prepared script a GPU machine runs for "real models on real hardware" (issue 19).
#
#   benchmarks/gpu_check.sh                 # on a machine with an NVIDIA GPU
#   DEVICE=cpu MODEL=tiny-qwen2-vl SIZE=56 PYTEST_K="tiny-qwen2-vl and float32" benchmarks/gpu_check.sh
#       the smoke test of the script itself (tests/benchmarks/test_gpu_check_script.py runs it in CI);
#       PYTEST_K narrows step 1 to the matching families and dtypes (pytest -k)
#
# 1. Cached == fresh equivalence on the device, in bfloat16 and float32, for every tiny
#    model family (tests/backends/test_backend_options.py::test_cached_equals_fresh_tokens_in_each_dtype
#    with REFSIGHT_TEST_DEVICE): greedy tokens equal, logits bit-identical, packages stored on the CPU.
# 2. benchmarks/cache_speedup.py on MODEL (default shape-qwen2-vl-2b) on the device in bfloat16:
#    one JSON line (fresh vs cached vs plain transformers, tokens_equal).
#
# Writes gpu_check.log, pytest.txt and cache_speedup.json into $OUT (default ./gpu-check-out).
# Needs: pip install '.[test]' with a CUDA build of torch. Expect ~1-2 min to build the
# shape model on first use (cached in $REFSIGHT_MODEL_CACHE), well under 10 min in all.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-shape-qwen2-vl-2b}
SIZE=${SIZE:-448}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export REFSIGHT_MODEL_CACHE=${REFSIGHT_MODEL_CACHE:-$OUT/models}
export HF_HUB_DISABLE_PROGRESS_BARS=1
exec > >(tee "$OUT/gpu_check.log") 2>&1

echo "== environment"
DEVICE=$DEVICE "$PY" - <<'PY'
import os, sys
import torch, transformers
device = os.environ["DEVICE"]
print("torch", torch.__version__, "transformers", transformers.__version__, "device", device)
if device.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit("gpu_check: torch sees no CUDA device (a CPU-only torch build?)")
    print("gpu", torch.cuda.get_device_name(0), "bf16", torch.cuda.is_bf16_supported())
PY

echo "== equivalence on $DEVICE (bfloat16, float32)"
status=0
REFSIGHT_TEST_DEVICE=$DEVICE "$PY" -m pytest -q -p no:cacheprovider \
    "tests/backends/test_backend_options.py::test_cached_equals_fresh_tokens_in_each_dtype" ${PYTEST_K:+-k "$PYTEST_K"} \
    | tee "$OUT/pytest.txt" || status=1

echo "== cache speed-up: $MODEL on $DEVICE in bfloat16"
"$PY" benchmarks/cache_speedup.py --model "$MODEL" --device "$DEVICE" --dtype bfloat16 --threads 8 --size "$SIZE" \
    | tee "$OUT/cache_speedup.json" || status=1
"$PY" - "$OUT/cache_speedup.json" <<'PY' || status=1
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
result = json.loads(lines[-1])
ok = all(run["tokens_equal"] for run in result["runs"])
print("tokens_equal in every run:", ok, "| speedup", result["speedup"], "| device", result["device"], result["dtype"])
sys.exit(0 if ok else 1)
PY
echo "== gpu_check: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
