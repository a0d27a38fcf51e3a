#!/usr/bin/env bash
# The measurement behind allreduce-h200x2.csv and allreduce-h200x2-reference.csv, as it ran on a
# 2x H200 machine with no Ansible installed: Ansible comes from wheels in .whl/ (ansible-core
# 2.19.14 and its dependencies for CPython 3.12) when that folder exists.
#
#   OUT_DIR=/some/dir bash docs/measurements/run_h200x2.sh      (from the repository root)
#
# The module's result is ad-hoc's default output: "localhost | CHANGED => {JSON}".
# Order: module (records a baseline), reference loop (NCCL_DEBUG=INFO), module again in check
# mode (compares against that baseline, writes nothing), reference loop again.
set -u
# NVLink multicast stays off for everything (NCCL, PyTorch symmetric memory, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1
REPO=$(pwd)
OUT_DIR=${OUT_DIR:-/tmp/allreduce-measurement}
BASELINE=/tmp/kimi-state/allreduce-baseline.json
mkdir -p "$OUT_DIR"
rm -f "$BASELINE"

{
  echo "== date -u"; date -u
  echo "== nvidia-smi -q | head -20"; nvidia-smi -q | head -20
  echo "== nvidia-smi --query-gpu"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv
  echo "== nvidia-smi topo -m"; nvidia-smi topo -m
  echo "== python3, torch, CUDA, NCCL"
  command -v python3
  python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda",
    torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  echo "== uname -a"; uname -a
} > "$OUT_DIR/env.txt" 2>&1

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >> "$OUT_DIR/run.log" 2>&1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
{ echo "== ansible --version"; ansible --version; } >> "$OUT_DIR/env.txt" 2>&1

ARGS='{"python": "python3", "nccl_env": {"NCCL_NVLS_ENABLE": "0",
  "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"},
  "baseline_file": "'$BASELINE'", "min_bytes": 32768, "max_bytes": 1073741824,
  "warmup": 5, "iterations": 20, "timeout": 240}'

module() {  # module OUTFILE [--check]
  local out=$1
  shift
  echo "== module $* $(date -u +%T)" >> "$OUT_DIR/run.log"
  if ansible --version > /dev/null 2>&1; then
    (cd /tmp && ANSIBLE_LIBRARY="$REPO/library" ANSIBLE_MODULE_UTILS="$REPO/module_utils" \
      timeout 280 ansible localhost -c local -m allreduce_check -a "$ARGS" "$@") \
      > "$out" 2>> "$OUT_DIR/run.log"
  else
    # No working ansible: run the module file as Ansible would, args from a JSON file.
    echo "ansible unusable; running the module directly" >> "$OUT_DIR/run.log"
    cp "$REPO"/module_utils/*.py /tmp/site/ansible/module_utils/
    python3 -c 'import json, sys; a = json.loads(sys.argv[1])
if sys.argv[2:]: a["_ansible_check_mode"] = True
print(json.dumps({"ANSIBLE_MODULE_ARGS": a}))' "$ARGS" "$@" > /tmp/allreduce-args.json
    timeout 280 python3 "$REPO/library/allreduce_check.py" /tmp/allreduce-args.json \
      > "$out" 2>> "$OUT_DIR/run.log"
  fi
  echo "rc=$? $(date -u +%T)" >> "$OUT_DIR/run.log"
}

reference() {  # reference CSVFILE LOGFILE [extra env]: CSV lines to CSVFILE, the rest to LOGFILE
  echo "== reference $(date -u +%T)" >> "$OUT_DIR/run.log"
  env "${@:3}" timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node \
    "$(nvidia-smi -L | wc -l)" "$REPO/docs/measurements/allreduce_reference.py" \
    > /tmp/reference.out 2>&1
  echo "rc=$? $(date -u +%T)" >> "$OUT_DIR/run.log"
  grep -E '^(bytes,|[0-9]+,)' /tmp/reference.out > "$1"
  grep -vE '^(bytes,|[0-9]+,)' /tmp/reference.out >> "$2"
}

module "$OUT_DIR/module-run1.txt"
cp "$BASELINE" "$OUT_DIR/baseline.json" 2>> "$OUT_DIR/run.log"
reference "$OUT_DIR/reference-run1.csv" "$OUT_DIR/reference-nccl.log" \
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV
module "$OUT_DIR/module-run2-check.txt" --check
reference "$OUT_DIR/reference-run2.csv" "$OUT_DIR/run.log"
echo "== done $(date -u +%T)" >> "$OUT_DIR/run.log"
