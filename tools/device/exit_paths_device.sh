#!/usr/bin/env bash
# One device call: everything device_run.sh shows at the quick tier (7 files under $OUT), then the exit paths
# gpuval took since its last GPU run, into $OUT/exit-paths.json: two more `accept --quick` on the same
# history (exit codes, wall time with start-up, the drift lines), and refusals a GPU node gives before any
# work (more ranks than GPUs, an unknown benchmark, a broken profile): exit code, lines of stderr, wall time.
# Usage on a device machine: bash tools/device/exit_paths_device.sh PROFILE
set -uo pipefail
PROFILE=${1:?profile}
TIERS=quick REFERENCE=0 bash "$(dirname "$0")/device_run.sh" "$PROFILE"
source "$(dirname "$0")/device_env.sh"
exec >> "$OUT/log.txt" 2>&1
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
SETS=(--set expect.gpu_count="$GPUS")
[ "$GPUS" = 1 ] && SETS+=(--set expect.nvlinks_per_gpu=null)
printf 'expect: [\n' > /tmp/broken.yaml
python3 - "$OUT/exit-paths.json" "$PROFILE" "$GPUS" "${SETS[@]}" <<'PY'
import json, subprocess, sys, time
out, profile, gpus, sets = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def run(name, args):
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gpuval", *args], capture_output=True, text=True, timeout=900)
    row = {"name": name, "args": args, "exit": p.returncode, "wall_s": round(time.monotonic() - start, 2),
           "stderr_lines": p.stderr.strip().splitlines()[-5:], "stdout_tail": p.stdout.strip().splitlines()[-12:]}
    print(json.dumps(row, indent=1), flush=True)
    return row
rows = []
for i in (2, 3):
    rows.append(run(f"accept-quick-{i}", ["accept", "--profile", profile, *sets, "--quick",
                                          "--output", f"/tmp/gpuval-runs/quick-{i}"]))
rows.append(run("more-ranks-than-gpus", ["accept", "--profile", profile, *sets, "--quick",
                                         "--nproc", str(gpus + 1), "--output", "/tmp/gpuval-runs/refused"]))
rows.append(run("unknown-benchmark", ["bench", "nosuchbench"]))
rows.append(run("broken-profile", ["accept", "--profile", "/tmp/broken.yaml", "--quick",
                                   "--output", "/tmp/gpuval-runs/broken"]))
json.dump({"gpus": gpus, "profile": profile, "rows": rows}, open(out, "w"), indent=2)
PY
