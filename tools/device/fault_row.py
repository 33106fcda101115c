"""One row of the fault matrix as a JSON line: the command, its exit code and wall time, the verdict and
every check that did not pass (from result.json when one was written, else the output's last lines)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--name", "--how", "--command", "--result", "--output-text"):
        parser.add_argument(name, required=True)
    parser.add_argument("--exit", type=int, required=True)
    parser.add_argument("--wall", type=float, required=True)
    args = parser.parse_args()
    row = {
        "name": args.name,
        "how": args.how,
        "command": args.command,
        "exit_code": args.exit,
        "wall_s": args.wall,
        "verdict": None,
        "not_passed": [],
    }
    result = Path(args.result)
    if result.is_file():
        data = json.loads(result.read_text())
        row["verdict"] = data["verdict"]
        row["duration_s"] = data["duration_s"]
        row["not_passed"] = [
            {key: check.get(key) for key in ("name", "status", "scope", "value", "threshold", "detail")}
            for check in data["checks"]
            if check["status"] not in ("PASS", "SKIP")
        ]
        row["skipped"] = sum(check["status"] == "SKIP" for check in data["checks"])
    text = Path(args.output_text).read_text(errors="replace").splitlines()
    row["output_tail"] = text[-6:]
    print(json.dumps(row))


if __name__ == "__main__":
    main()
