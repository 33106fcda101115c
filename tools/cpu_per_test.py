"""CPU seconds each test costs, its own and its child processes' (torchrun ranks, gpuval runs): where the
CI budget goes, since .ci/run is bound by the CPU of two cores, not by any one test's wall time.

As a pytest plugin, on the tool's folder (every xdist worker writes its own file):

    PYTHONPATH=tools python -m pytest -p cpu_per_test    # writes TEST_CPU_OUT (default .test-cpu/) PID.jsonl

then `python tools/cpu_per_test.py [FOLDER] [--top N]` prints the totals, per module and the top tests.
Children count once they have been waited for (resource.RUSAGE_CHILDREN), grandchildren through them;
a process left running past its test is not counted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

OUT_VARIABLE = "TEST_CPU_OUT"
DEFAULT_OUT = ".test-cpu"


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    before = _cpu_seconds()
    yield
    after = _cpu_seconds()
    folder = Path(os.environ.get(OUT_VARIABLE, DEFAULT_OUT))
    folder.mkdir(parents=True, exist_ok=True)
    row = {"id": item.nodeid, "self": after[0] - before[0], "children": after[1] - before[1]}
    with (folder / f"{os.getpid()}.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")


def summary(folder: Path, top: int) -> str:
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.open()]
    cost = {row["id"]: row["self"] + row["children"] for row in rows}
    modules: collections.Counter[str] = collections.Counter()
    for test, seconds in cost.items():
        modules[test.split("::")[0]] += seconds
    lines = [
        f"{len(rows)} tests, {sum(cost.values()):.0f} CPU-s "
        f"({sum(r['self'] for r in rows):.0f} in the test processes, "
        f"{sum(r['children'] for r in rows):.0f} in their children)",
        "",
        "| CPU-s | module |",
        "| ---: | --- |",
        *(f"| {seconds:.1f} | `{module}` |" for module, seconds in modules.most_common(top)),
        "",
        "| CPU-s | of it in children | test |",
        "| ---: | ---: | --- |",
    ]
    by_cost = sorted(rows, key=lambda row: -(row["self"] + row["children"]))[:top]
    lines += [f"| {r['self'] + r['children']:.1f} | {r['children']:.1f} | `{r['id']}` |" for r in by_cost]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=Path(DEFAULT_OUT))
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summary(args.folder, args.top))


if __name__ == "__main__":
    main()
