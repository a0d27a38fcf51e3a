#!/usr/bin/env bash
# The speed model's calibration on one real H200: module_utils/tuning/speed_calibration.py run bare
# (plain python3, no Ansible), then the tagged tasks that run it on a GPU host
# (deploy_kimi.yml --tags calibrate) twice against localhost in the h200 profile: the first
# measures and records, the second must keep the record and report changed=0.
#
#   OUT_DIR=$OUT bash docs/measurements/run_speed_calibration_h200.sh   (repository root; carry: .whl)
#
# The image has Python 3.12 and torch 2.11 (CUDA 13.0) but no Ansible and no network:
# ansible-core and what it needs travel as wheels in .whl/ and go into /tmp/site, never over the
# image's packages. Without .whl/ only the bare run happens.
#
# Writes into OUT_DIR: speed-calibration-h200.log (the machine, the versions, the bare run's
# table and record line), speed-calibration-h200.json (the bare run's record),
# speed-calibration-h200-playbook-run1.txt and -run2.txt (the two playbook runs) and
# speed-calibration-h200-playbook.json (the record the first one wrote on the "host").
set -u
export LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1
# NVLink multicast stays off, as on every device run (it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
REPO=$(pwd)
OUT_DIR=${OUT_DIR:-/tmp/speed-calibration-h200}
WORK=${WORK:-/tmp/kimi-speed-calibration}
LOG=$OUT_DIR/speed-calibration-h200.log
rm -rf "$WORK" && mkdir -p "$OUT_DIR" "$WORK/inventory"

{
  echo "== date -u"; date -u
  echo "== uname -a"; uname -a
  echo "== nvidia-smi -L"; nvidia-smi -L
  echo "== nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,memory.used,clocks.max.sm,clocks.max.mem,power.limit"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,memory.used,clocks.max.sm,clocks.max.mem,power.limit --format=csv
  echo "== python3, torch, the grouped GEMMs it has"
  python3 - <<'EOF'
import sys, torch
print(sys.version.split()[0], sys.executable)
props = torch.cuda.get_device_properties(0)
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())
print("device", props.name, f"cc {props.major}.{props.minor}", "SMs", props.multi_processor_count,
      "L2", props.L2_cache_size, "bytes")
print("torch.nn.functional.grouped_mm", hasattr(torch.nn.functional, "grouped_mm"),
      "torch._grouped_mm", hasattr(torch, "_grouped_mm"))
EOF
} > "$LOG" 2>&1

# 1. Bare, with its defaults (tokens 1,8,17,33,65,129,257, 20 repeats, deadline 300 s).
echo "== 1. python3 module_utils/tuning/speed_calibration.py --out \$OUT_DIR/speed-calibration-h200.json ($(date -u +%T))" >> "$LOG"
start=$(date +%s.%N)
timeout 400 python3 module_utils/tuning/speed_calibration.py --out "$OUT_DIR/speed-calibration-h200.json" >> "$LOG" 2>&1
rc=$?
end=$(date +%s.%N)
echo "== exit $rc after $(python3 -c "print(round($end - $start, 1))") s" >> "$LOG"

# 2. The tagged tasks, twice, through deploy_kimi.yml against localhost (h200 profile). The
# host's files go under $WORK: the record, the controller's state folder, both locks.
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >> "$LOG" 2>&1 || { echo "installing .whl/ failed" >> "$LOG"; exit 1; }
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  ln -s "$REPO/group_vars" "$WORK/inventory/group_vars"
  cat > "$WORK/inventory/hosts.yml" <<YAML
all:
  children:
    gpu_hosts:
      children:
        h200:
          hosts:
            localhost:
              ansible_connection: local
              ansible_python_interpreter: python3
YAML
  cat > "$WORK/vars.json" <<JSON
{"tuning_speed_calibration_python": "python3",
 "kimi_speed_calibration_file": "$WORK/host/speed-calibration.json",
 "kimi_controller_state_dir": "$WORK/state",
 "kimi_host_lock_file": "$WORK/lock/lock.json",
 "kimi_lock_file": "$WORK/kimi.lock.yml"}
JSON
  ansible --version | head -1 >> "$LOG" 2>&1
  for run in 1 2; do
    echo "== 2.$run ansible-playbook -i \$WORK/inventory deploy_kimi.yml --tags calibrate -e @\$WORK/vars.json ($(date -u +%T))" >> "$LOG"
    timeout 240 ansible-playbook -i "$WORK/inventory" deploy_kimi.yml --tags calibrate \
      -e "@$WORK/vars.json" > "$OUT_DIR/speed-calibration-h200-playbook-run$run.txt" 2>&1
    echo "== exit $? ($(date -u +%T)); recap: $(grep -A1 'PLAY RECAP' "$OUT_DIR/speed-calibration-h200-playbook-run$run.txt" | tail -1)" >> "$LOG"
  done
  cp "$WORK/host/speed-calibration.json" "$OUT_DIR/speed-calibration-h200-playbook.json" >> "$LOG" 2>&1
  if cmp "$WORK/host/speed-calibration.json" "$WORK/state/localhost/speed-calibration.json" >> "$LOG" 2>&1; then
    echo "== the controller's copy is the host's record, byte for byte" >> "$LOG"
  fi
fi
