"""The fault matrix's CPU-reachable rows, timed through the CLI on a fake node (no GPU needed).

The fake node is the tests' own (tests/test_health.py): a sysfs tree under GPUVAL_SYSFS_ROOT holding eight
H100s on the PCI bus, and NVML replayed from a recording of a real H100 (tests/dist/nvmlhook), or failing
to start. Each row runs `python -m gpuval ...` as a user would and records exit code, verdict, the checks
that did not pass, and the seconds to the verdict.

    python tools/device/fault_matrix_cpu.py --output fault-matrix-cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(TESTS))

from test_health import EIGHT, fake_node, pci_tree  # noqa: E402 - the tests' fake node, on purpose


def run_row(name: str, how: str, args: list[str], env: dict[str, str], work: Path) -> dict:
    out = work / name
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gpuval", *args, "--output", str(out)],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall_s = round(time.perf_counter() - began, 2)
    row = {"name": name, "how": how, "command": ["gpuval", *args], "exit_code": proc.returncode}
    row["wall_s"] = wall_s
    result = out / "result.json"
    if result.is_file():
        data = json.loads(result.read_text())
        row["verdict"] = data["verdict"]
        row["not_passed"] = [
            {key: c.get(key) for key in ("name", "status", "scope", "detail")}
            for c in data["checks"]
            if c["status"] not in ("PASS", "SKIP")
        ]
    else:
        row["verdict"] = None
        row["stderr_tail"] = proc.stderr.strip().splitlines()[-3:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dead = fake_node(pci_tree(work / "dead", EIGHT), init_error="NVMLError_DriverNotLoaded")
        missing = fake_node(pci_tree(work / "missing", EIGHT[:2]))  # NVML: one H100; the bus: two
        cuda_blind = fake_node(work / "blind")  # NVML answers for an H100; CUDA here cannot run
        one = ["--set", "expect.gpu_count=1", "--set", "expect.nvlinks_per_gpu=null"]
        rows = [
            run_row(
                "driver-not-loaded-health",
                "8 H100s on the PCI bus, NVML: DriverNotLoaded, no --profile",
                ["health"],
                dead,
                work,
            ),
            run_row(
                "driver-not-loaded-accept",
                "the same, gpuval accept --quick, no --profile",
                ["accept", "--quick"],
                dead,
                work,
            ),
            run_row(
                "gpu-missing-from-nvml",
                "2 H100s on the PCI bus, NVML lists 1",
                ["health", *one],
                missing,
                work,
            ),
            run_row(
                "cuda-cannot-use-nvml-gpu",
                "NVML lists an H100, CUDA cannot use it (CPU torch)",
                ["accept", "--quick", *one],
                cuda_blind,
                work,
            ),
        ]
    document = {
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    Path(args.output).write_text(json.dumps(document, indent=2) + "\n")
    for row in rows:
        shown = "; ".join(f"{c['name']}={c['status']}" for c in row.get("not_passed", [])[:3])
        print(f"{row['name']:28} exit={row['exit_code']} verdict={row['verdict']} {row['wall_s']} s  {shown}")


if __name__ == "__main__":
    main()
