"""docs/thresholds.md is written from the profiles (gpuval.threshold_table): the committed document is
what the profiles and benchmarks/derivation.yaml give now, every bound is a row, and a derived bound's
source turns into its rule and its runs."""

from __future__ import annotations

import re
from pathlib import Path

from gpuval.config import Threshold, builtin_profiles, load_profile
from gpuval.derive import Rule, Run, checks_yaml, derive_check
from gpuval.results import Measurement
from gpuval.threshold_table import COMMAND, render

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "benchmarks" / "derivation.yaml"
DOCUMENT = REPO / "docs" / "thresholds.md"


def test_the_committed_document_is_what_the_profiles_give_now():
    now = render(MANIFEST, DOCUMENT.parent)
    committed = DOCUMENT.read_text(encoding="utf-8")
    assert committed == now, (
        f"docs/thresholds.md differs from the profiles and benchmarks/derivation.yaml: run `{COMMAND}` "
        "from the repository root and commit it"
    )


def test_every_bound_of_every_builtin_profile_is_a_row_with_its_value():
    text = render(MANIFEST, DOCUMENT.parent)
    for name in builtin_profiles():
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        rows = [line for line in section.splitlines() if re.match(r"^\| `[a-z_0-9]+\.[a-z_0-9]+`", line)]
        checks = load_profile(name).checks
        bounds = sum((1 if t.flat else 0) + len(t.by_gpus or {}) for t in checks.values())
        assert len(rows) == bounds, f"{name}: {len(rows)} rows for {bounds} bounds"
        for check, threshold in checks.items():
            values = [threshold.min, threshold.max] + [
                side for bound in (threshold.by_gpus or {}).values() for side in (bound.min, bound.max)
            ]
            for value in (v for v in values if v is not None):
                shown = format(value, ",.10g")
                assert any(f"`{check}`" in row and shown in row for row in rows), f"{name}: {check} {shown}"


def _run(label: str, values: list[float]) -> Run:
    measurements = tuple(
        Measurement(name="matmul", scope=f"gpu:n1/{index}", metrics={"bf16_tflops": value})
        for index, value in enumerate(values)
    )
    return Run(label, len(values), ("NVIDIA H200",), measurements)


def test_a_derived_bound_shows_its_rule_and_links_every_run_its_source_names(tmp_path):
    runs = [
        _run("2026-12-01-h200x2-accept/a.json", [700.0, 704.0]),
        _run("2026-12-01-h200x2-accept/b.json", [702.0]),
        _run("2026-12-02-h200x1-windows/matmul.json", [706.0]),
    ]
    derived = derive_check("matmul.bf16_tflops", Threshold(min=1), runs, Rule())
    checks = {
        "matmul.bf16_tflops": derived,
        "all_reduce.busbw_gbps": Threshold(min=300, bytes=2**30, source="hand-set: no run of 8 GPUs yet"),
    }
    profile = tmp_path / "toy.yaml"
    profile.write_text(
        "# A toy GPU.\nname: toy\ndescription: a toy\n" + checks_yaml(checks), encoding="utf-8"
    )
    profile.write_text(profile.read_text() + "  outliers.matmul_pct: {max: 7}  # set for the test\n")
    manifest = tmp_path / "derivation.yaml"
    manifest.write_text(
        "root: .\nresults: results\nprofiles:\n  toy:\n    profile: toy.yaml\n    runs:\n"
        "      - {path: 2026-12-01-h200x2-accept/a.json, skip: [membw.*], why: a reason}\n"
        "      - 2026-12-01-h200x2-accept/b.json\n      - 2026-12-02-h200x1-windows/matmul.json\n",
        encoding="utf-8",
    )
    text = render(manifest, tmp_path / "docs", profiles=[profile])
    row = next(line for line in text.splitlines() if line.startswith("| `matmul.bf16_tflops`"))
    assert f"≥ {derived.min:g} TFLOP/s" in row
    # no inventory names a node: each run counts as one; 700, 704, 702, 706: sd 2.58 / median 703 = 0.37 %
    assert "derived from 3 runs on 3 nodes (4 values, spread 0.37 %, none left out): min 700 −" in row
    assert "`2026-12-01-h200x2-accept/` a.json, b.json; `2026-12-02-h200x1-windows/` matmul.json" in row
    hand_set = next(
        line for line in text.splitlines() if line.startswith("| `all_reduce.busbw_gbps` @ 1 GiB")
    )
    assert "| hand-set | no run of 8 GPUs yet |" in hand_set
    assert "| `outliers.matmul_pct` | any | ≤ 7 % | set by hand | set for the test |" in text
    link = "[`2026-12-01-h200x2-accept/a.json`](../results/2026-12-01-h200x2-accept/a.json)"
    assert f"{link} — not `membw.*`: a reason" in text
    assert "From the profile's file: A toy GPU." in text


def test_the_command_checks_a_document_and_says_how_to_regenerate_it(gpuval, tmp_path, assert_usage_error):
    stale = tmp_path / "thresholds.md"
    stale.write_text(DOCUMENT.read_text(encoding="utf-8").replace("≥ ", "> ", 1), encoding="utf-8")
    command = ["profiles", "table", "--manifest", str(MANIFEST), "--output", str(stale), "--check"]
    proc = gpuval(command, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"differs from what the profiles give now: run `{COMMAND}`" in proc.stderr
    assert (
        gpuval(
            ["profiles", "table", "--manifest", str(MANIFEST), "--output", str(stale)], tmp_path
        ).returncode
        == 0
    )
    assert gpuval(command, tmp_path).returncode == 0
    assert_usage_error(gpuval(["profiles", "table"], tmp_path), "no manifest at benchmarks/derivation.yaml")
