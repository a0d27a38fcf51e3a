#!/usr/bin/env bash
# The tiny K2.6 canary checkpoint on one real H200: generated with the kit's own
# module_utils/canary/checkpoint.py, its text model loaded with transformers' DeepseekV3 class
# (the compressed-tensors quantizer first, BF16 after compressed-tensors' own decompression if
# that fails) and run forward on the GPU (canary_h200.py says what each step checks).
#
#   OUT_DIR=$OUT bash docs/measurements/run_canary_h200.sh      (from the repository root)
#
# The H200 image has Python 3.12, torch 2.11 (CUDA 13.0), transformers 5.17.0 and safetensors
# 0.8.0, but no compressed-tensors and no network: its wheel and those it needs that the image
# lacks (loguru, pydantic and its own requirements) travel in .whl/ (the device tool's carry),
# and are installed into /tmp/site, never over the image's packages.
#
# Writes into OUT_DIR: canary-h200.log (everything printed), canary-h200.json (the RESULT
# records, one per step, the summary last) and canary-h200-env.txt (GPU, driver, versions).
set -u
export LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1
# NVLink multicast stays off (the device README: it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT_DIR=${OUT_DIR:-/tmp/canary-h200}
WORK=${WORK:-/tmp/canary-h200-work}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/canary-h200.log

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  echo "== date -u"; date -u
  echo "== uname -a"; uname -a
  echo "== nvidia-smi -L"; nvidia-smi -L
  echo "== nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv
  echo "== python3 and packages"
  python3 - <<'EOF'
import sys
print(sys.version)
for name in ("torch", "transformers", "safetensors", "compressed_tensors", "pydantic", "loguru"):
    try:
        module = __import__(name)
        print(name, getattr(module, "__version__", "?"), module.__file__)
    except Exception as error:  # a missing package is what this line is for
        print(name, "MISSING", error)
EOF
} > "$OUT_DIR/canary-h200-env.txt" 2>&1

start=$(date +%s.%N)
python3 docs/measurements/canary_h200.py --work "$WORK" --device cuda > "$LOG" 2>&1
rc=$?
end=$(date +%s.%N)
echo "== exit $rc after $(python3 -c "print(round($end - $start, 1))") s" >> "$LOG"
python3 - "$LOG" "$OUT_DIR/canary-h200.json" <<'EOF'
import json, sys
records = [json.loads(line[len("RESULT "):]) for line in open(sys.argv[1]) if line.startswith("RESULT ")]
json.dump(records, open(sys.argv[2], "w"), indent=1)
EOF
grep '^RESULT' "$LOG"
tail -3 "$LOG"
exit $rc
