#!/usr/bin/env bash
# The tuning stage's all-reduce step run for real: playbooks/tuning.yml on a 2x H200 machine
# (localhost, h200 profile), twice. The first run measures and writes the baseline (changed);
# the second measures again, compares with it and must report changed=0.
#
#   OUT_DIR=/some/dir bash docs/measurements/run_tuning_h200x2.sh      (from the repository root)
#
# The machine's own settings are left as they are: kernel values go through a fake tree
# (tuning_sys_root), persistence mode, governor, fabric manager and the sysctl.d file are
# turned off, /etc/nccl.conf and the state file go under /tmp. NVLink multicast stays off: the
# profile's NCCL_NVLS_ENABLE=0, and the exports below, which the worker processes inherit.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1
REPO=$(pwd)
OUT_DIR=${OUT_DIR:-/tmp/tuning-measurement}
WORK=/tmp/kimi-tuning
rm -rf "$WORK" && mkdir -p "$OUT_DIR" "$WORK/inventory" "$WORK/fakesys/proc/sys/kernel"
echo 1 > "$WORK/fakesys/proc/sys/kernel/numa_balancing"
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
{"tuning_sys_root": "$WORK/fakesys", "tuning_sysctl_conf": "", "tuning_cpu_governor": "",
 "tuning_nccl_conf": "$WORK/nccl.conf", "tuning_state_file": "$WORK/tuning-state.json",
 "tuning_persistence_mode": false, "tuning_fabricmanager": false, "tuning_acs_report": false,
 "tuning_allreduce_python": "python3",
 "tuning_allreduce_baseline_file": "$WORK/allreduce-baseline.json",
 "kimi_nccl_environment": {"NCCL_NVLS_ENABLE": "0"}}
JSON
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$OUT_DIR/install.log" 2>&1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv; ansible --version
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
} > "$OUT_DIR/env.txt" 2>&1
for run in 1 2; do
  timeout 280 ansible-playbook -i "$WORK/inventory" playbooks/tuning.yml -e "@$WORK/vars.json" \
    > "$OUT_DIR/tuning-run$run.txt" 2>&1
  echo "run $run rc=$?" >> "$OUT_DIR/env.txt"
done
cp "$WORK/allreduce-baseline.json" "$WORK/nccl.conf" "$WORK/tuning-state.json" "$OUT_DIR/" 2>&1
