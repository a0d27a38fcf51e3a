#!/usr/bin/env bash
# The measurement behind telemetry-h200.csv / .json / .md: module_utils/benchmark/gpu_telemetry.py run bare
# (plain python3, no Ansible) at 200 ms while one H200 idles, then runs a sustained bf16 matmul
# load, then idles again. The point is what a GPU does under a long dense load (the power cap,
# the SM clock it settles at), which decides what a benchmark level's throughput means.
#
#   OUT_DIR=/some/dir bash docs/measurements/run_telemetry_h200.sh      (from the repository root)
#
# Writes into OUT_DIR: telemetry-h200.csv (the sampler's raw rows, a header line first),
# telemetry-h200.json (its summary, as a level's summary.gpu), telemetry-h200.log (environment,
# the field names checked against this driver's --help-query-gpu, the load's own TFLOP/s per
# window) and telemetry-h200-smi-q.txt (nvidia-smi -q POWER/CLOCK/PERFORMANCE before, during
# and after the load).
set -u
export LC_ALL=C.UTF-8 LANG=C.UTF-8 PYTHONUNBUFFERED=1
OUT_DIR=${OUT_DIR:-/tmp/telemetry-measurement}
IDLE_S=${IDLE_S:-10}
LOAD_S=${LOAD_S:-120}
SIZE=${SIZE:-16384}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/telemetry-h200.log
SMIQ=$OUT_DIR/telemetry-h200-smi-q.txt

{
  echo "== date -u"; date -u
  echo "== uname -a"; uname -a
  echo "== nvidia-smi -L"; nvidia-smi -L
  echo "== nvidia-smi --version"; nvidia-smi --version
  echo "== python3, torch"
  python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__,
    "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  echo "== the sampler's fields in this driver's nvidia-smi --help-query-gpu"
  nvidia-smi --help-query-gpu | grep -E -A2 \
    '^"(timestamp|index|name|power\.draw|power\.limit|clocks\.(current\.)?sm|clocks\.max\.sm|clocks\.(current\.)?memory|temperature\.gpu|utilization\.gpu|memory\.used|clocks_event_reasons\.active|clocks_throttle_reasons\.active)"'
  echo "== clocks_event_reasons bits (help text)"
  nvidia-smi --help-query-gpu | grep -E -A3 '^"clocks_event_reasons\.' | head -60
} > "$LOG" 2>&1

smi_q() {  # smi_q LABEL
  { echo "===== $1 ($(date -u +%T))"; nvidia-smi -q -d POWER,CLOCK,PERFORMANCE; } >> "$SMIQ" 2>&1
}
smi_q "before the load"

SAMPLE_S=$((IDLE_S + LOAD_S + IDLE_S + 15))
echo "== sampler: python3 module_utils/benchmark/gpu_telemetry.py --seconds $SAMPLE_S --interval-ms 200 (start $(date -u +%T.%N))" >> "$LOG"
python3 module_utils/benchmark/gpu_telemetry.py --seconds "$SAMPLE_S" --interval-ms 200 \
  --csv "$OUT_DIR/telemetry-h200.csv" --json "$OUT_DIR/telemetry-h200.json" >> "$LOG" 2>&1 &
SAMPLER=$!

# The load: random bf16 operands (zeros draw less power), products into one preallocated output,
# synchronised every few products so each window's TFLOP/s is the GPU's, not the queue's.
SMIQ="$SMIQ" IDLE_S="$IDLE_S" LOAD_S="$LOAD_S" SIZE="$SIZE" python3 - >> "$LOG" 2>&1 <<'EOF'
import os, subprocess, time
import torch

idle_s, load_s, n = float(os.environ["IDLE_S"]), float(os.environ["LOAD_S"]), int(os.environ["SIZE"])
def stamp():
    return time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}"
print(f"== load: idle {idle_s:g} s, then {n}x{n}x{n} bf16 matmuls for {load_s:g} s, then idle", flush=True)
time.sleep(idle_s)
torch.manual_seed(0)
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
flop = 2.0 * n * n * n
print(f"{stamp()} load starts", flush=True)
start = time.monotonic()
window_start, window_count, total, mid_done = start, 0, 0, False
while time.monotonic() - start < load_s:
    for _ in range(20):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    window_count += 20
    total += 20
    now = time.monotonic()
    if not mid_done and now - start >= load_s / 2:
        mid_done = True
        with open(os.environ["SMIQ"], "a") as out:
            out.write(f"===== during the load ({stamp()}, {now - start:.0f} s in)\n")
            out.flush()
            subprocess.run(["nvidia-smi", "-q", "-d", "POWER,CLOCK,PERFORMANCE"], stdout=out,
                           stderr=subprocess.STDOUT, timeout=30)
        window_start, window_count = time.monotonic(), 0
        continue
    if now - window_start >= 10:
        print(f"{stamp()} t={now - start:6.1f}s window {window_count * flop / (now - window_start) / 1e12:7.1f} TFLOP/s", flush=True)
        window_start, window_count = now, 0
elapsed = time.monotonic() - start
print(f"{stamp()} load ends: {total} products in {elapsed:.2f} s = {total * flop / elapsed / 1e12:.1f} TFLOP/s sustained (nvidia-smi -q pause included)", flush=True)
del a, b, c
torch.cuda.empty_cache()
time.sleep(idle_s)
print(f"{stamp()} idle after the load ends", flush=True)
EOF
smi_q "after the load and the idle"
wait "$SAMPLER"
echo "== sampler exit $? ($(date -u +%T))" >> "$LOG"
ls -l "$OUT_DIR" >> "$LOG"
