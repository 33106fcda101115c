#!/usr/bin/env bash
# Issue 22's exporter evidence in one device call: every NVML answer gpuval's monitor reads, recorded on a
# real GPU while a bf16 matmul load runs on it (GPM activity, clocks, power, energy), then the exporter's
# own output scraped twice over HTTP: under the load and after it stopped.
# Usage on a device machine (one GPU is enough): bash tools/device/exporter_device.sh
# Files under $OUT (8 at most come back): env.json, nvml-load.json (tools/record_nvml.py), metrics-load.txt,
# metrics-idle.txt (the scraped /metrics), monitor-load.json (the monitor's --json reading beside the
# scrape), exporter-stop.txt (how long the monitor took to stop, XID thread included), log.txt.
# What to commit: nvml-load.json as tests/data/nvml/h100x1-load.json and metrics-load.txt as
# tests/data/exporter/h100x1-load-metrics.txt (tests/test_exporter_parity.py replays them), the rest beside a
# README under benchmarks/results/.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
RUNS=/tmp/gpuval-runs
mkdir -p "$RUNS"
exec > >(tee "$OUT/log.txt") 2>&1
export GPUVAL_HISTORY=none

python3 - "$OUT/env.json" <<'PY'
import json, sys, datetime, importlib.metadata, torch, pynvml
pynvml.nvmlInit()
info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "nvidia_ml_py": importlib.metadata.version("nvidia-ml-py"),
        "prometheus_client": importlib.metadata.version("prometheus-client"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(info)
PY

hog_pid=""
stop_hog() { [ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null; wait "$hog_pid" 2>/dev/null; hog_pid=""; }
monitor_pid=""
stop_monitor() { [ -n "$monitor_pid" ] && kill -TERM "$monitor_pid" 2>/dev/null; wait "$monitor_pid" 2>/dev/null; }
scrape() {  # scrape URL FILE: one GET of /metrics, the body as served
  python3 -c 'import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1], timeout=10).read())' \
    "$1" >"$2"
}
trap 'stop_monitor; stop_hog' EXIT

# The load: bf16 8192^3 products back to back on GPU 0 (tensor pipes, DRAM, power), until killed.
python3 tools/device/gpu_hog.py --compute --seconds 300 >"$RUNS/hog.txt" 2>&1 &
hog_pid=$!
for _ in $(seq 1 120); do grep -q ready "$RUNS/hog.txt" && break; sleep 0.5; done
grep -q ready "$RUNS/hog.txt" || { echo "load did not start"; cat "$RUNS/hog.txt"; exit 1; }
sleep 5  # clocks and power settle under the load

# Every answer gpuval's discovery, health and monitor read, GPM over 2 s of the load, one XID event wait.
python3 tools/record_nvml.py --output "$OUT/nvml-load.json" --gpm-interval 2

# The exporter as a user runs it; its stderr names the address it took.
python3 -m gpuval monitor --prometheus 127.0.0.1:0 --interval 1 --json >"$RUNS/monitor.jsonl" \
  2>"$RUNS/monitor.err" &
monitor_pid=$!
url=""
for _ in $(seq 1 60); do
  url=$(grep -o 'http://[^ ]*/metrics' "$RUNS/monitor.err" | head -n 1)
  [ -n "$url" ] && break
  sleep 0.5
done
[ -n "$url" ] || { echo "the exporter did not start"; cat "$RUNS/monitor.err"; exit 1; }
sleep 4  # three readings: the rates and GPM need two
scrape "$url" "$OUT/metrics-load.txt" || echo "scrape under load failed"
tail -n 1 "$RUNS/monitor.jsonl" >"$OUT/monitor-load.json"
stop_hog
sleep 4
scrape "$url" "$OUT/metrics-idle.txt" || echo "idle scrape failed"

# SIGTERM (a service manager's stop) ends the monitor with exit 0; the XID thread's last wait (0.5 s at
# most) ends before it exits.
start=$(date +%s.%N)
kill -TERM "$monitor_pid"
wait "$monitor_pid"
rc=$?
end=$(date +%s.%N)
monitor_pid=""
echo "monitor exit=$rc stop_s=$(python3 -c "print(round($end-$start, 3))")" | tee "$OUT/exporter-stop.txt"
cat "$RUNS/monitor.err"
grep -c '^DCGM_FI_' "$OUT/metrics-load.txt" "$OUT/metrics-idle.txt"
grep -E '^DCGM_FI_(PROF|DEV_XID|DEV_MEMORY_TEMP|DEV_TOTAL_ENERGY)' "$OUT/metrics-load.txt"
