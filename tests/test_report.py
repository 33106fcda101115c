"""report.html from real results: the 4xH200 run committed under benchmarks/results and a CPU accept run;
and the console's check table, which keeps its hints readable at 80 columns.

The page is opened in headless Chromium (Debian's `chromium`): it renders, the browser console stays
silent, the plots are in the rendered DOM, and a screenshot is not blank. GPUVAL_REQUIRE_CHROMIUM=1
(.ci/run) turns a missing browser into a failure instead of a skip.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from gpuval.report.console import print_result
from gpuval.report.html import render_html
from gpuval.results import Check, Result, Status, World, load_result

REPO = Path(__file__).resolve().parents[1]
H200X4 = REPO / "benchmarks" / "results" / "2026-11-22-h200x4-device-run" / "accept-standard.json"


@pytest.fixture(scope="module")
def h200x4_html() -> str:
    return render_html(load_result(H200X4))


def _figure(page: str, key: str) -> str:
    match = re.search(rf'<figure id="plot-{key}">(.*?)</figure>', page, re.S)
    assert match, f"no plot-{key}"
    return match[1]


def test_failed_checks_come_first_with_their_hints(h200x4_html):
    problems = h200x4_html[h200x4_html.index('id="problems"') : h200x4_html.index('id="inventory"')]
    assert "Problems (7)" in problems
    rows = re.findall(r"<tr><td class=\"status\"[^>]*>(\w+)</td><td>([^<]+)</td><td>([^<]+)</td>", problems)
    assert len(rows) == 7 and {status for status, _, _ in rows} == {"FAIL"}
    assert ("FAIL", "membw.h2d_gbps", "gpu:vm/1") in rows
    assert "check the PCIe link" in problems  # the hint travels with the check
    assert h200x4_html.index('id="problems"') < h200x4_html.index('id="checks"')  # before the full list
    banner = h200x4_html[: h200x4_html.index("</header>")]
    assert ">FAIL</h1>" in banner and "107 PASS · 7 FAIL · 5 SKIP" in banner


def test_plots_carry_the_measurements_thresholds_and_medians(h200x4_html):
    collectives = _figure(h200x4_html, "collectives")
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv"):
        assert f">{op}</text>" in collectives  # a legend entry per collective
    assert ">1 MiB</text>" in collectives and ">4 GiB</text>" in collectives  # log2 sizes, in bytes
    per_gpu = _figure(h200x4_html, "per-gpu")
    # bf16 on the four GPUs: 702.4, 679.6, 675.3, 703.5 -> median (679.6 + 702.4) / 2 = 691.0
    assert "median 691" in per_gpu and "profile minimum 650" in per_gpu
    assert "median 4.244" in per_gpu  # HBM copy: 4.240, 4.247, 4.244, 4.244
    p2p = _figure(h200x4_html, "p2p")
    assert p2p.count(">394<") + p2p.count(">395<") == 12  # every ordered pair of four GPUs, labelled
    assert 'id="plot-train"' not in h200x4_html  # this run had no training benchmark: no empty plot


def test_the_page_needs_nothing_from_outside(h200x4_html):
    for needle in ("<script", "<link", " src=", "@import"):
        assert needle not in h200x4_html, needle
    assert not re.search(r"url\((?!#)", h200x4_html)  # only the SVG's own clip paths, by id
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", h200x4_html))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls  # namespaces


@pytest.mark.slow  # 3-10 s on 2 cores (2026-11-27 profile of the inner loop)
def test_cli_report_writes_beside_the_result_and_refuses_a_file_that_is_no_result(tmp_path, gpuval):
    copy = tmp_path / "result.json"
    copy.write_text(H200X4.read_text())
    proc = gpuval(["report", str(copy)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    other = tmp_path / "env.json"
    other.write_text(json.dumps({"torch": "2.11"}))
    proc = gpuval(["report", str(other), "--output", str(tmp_path / "x.html")], tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "x.html").exists()
    assert proc.stderr.strip().splitlines() == [
        f"gpuval: {other} is not a gpuval result.json (schema: none, expected gpuval.result/v1): pass the "
        "result.json that gpuval accept or health wrote"
    ]


# --- in a real browser ---------------------------------------------------------------------------------


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        if os.environ.get("GPUVAL_REQUIRE_CHROMIUM") == "1":
            pytest.fail("GPUVAL_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def _browse(page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [
        _chromium(),
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--log-level=0",  # console messages are INFO lines: "INFO:CONSOLE(...)"
        f"--user-data-dir={page.parent / 'chromium-profile'}",
        *flags,
        page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture
def accept_cpu_report(cpu_accept_run, tmp_path) -> Path:
    """report.html as `gpuval accept` writes it on this CPU machine (training plot included): conftest's one
    accept run, copied to a folder of this test's, where Chromium writes its profile beside it."""
    proc, out = cpu_accept_run
    assert proc.returncode == 0, proc.stderr
    assert "report.html" in proc.stdout
    page = tmp_path / "accept" / "report.html"
    page.parent.mkdir()
    shutil.copyfile(out / "report.html", page)
    return page


@pytest.mark.parametrize("which", ["h200x4", "cpu"])
@pytest.mark.browser
def test_report_renders_in_headless_chromium_without_console_errors(which, tmp_path, accept_cpu_report):
    if which == "h200x4":
        page = tmp_path / "report.html"
        page.write_text(render_html(load_result(H200X4)))
        expected_plots = {"plot-collectives", "plot-per-gpu", "plot-p2p"}
    else:
        page = accept_cpu_report
        expected_plots = {"plot-collectives", "plot-per-gpu", "plot-train"}
    dom = _browse(page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    rendered = dom.stdout
    figures = set(re.findall(r'<figure id="(plot-[\w-]+)"', rendered))
    assert figures == expected_plots
    assert rendered.count("<svg") >= len(expected_plots)

    shot = tmp_path / "shot.png"
    proc = _browse(page, "--window-size=1280,1800", f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    import numpy as np
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    assert pixels.shape[:2] == (1800, 1280)
    not_white = (pixels < 0.95).any(axis=2).mean()
    colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert not_white > 0.05 and colours > 50  # text, a coloured banner and plots, not a blank page


# --- the console's check table ---------------------------------------------------------------------------

# A FAIL whose hint is longer than 80 columns, a WARN whose hint fits one line with its number (and holds
# what rich would read as markup), and a PASS, whose detail no table shows.
LONG_HINT = (
    "44.48 GB/s on gpu:node-a/0, required >= 50: check the PCIe link (nvidia-smi -q -d PCI: generation "
    "and width) and NUMA binding"
)
SHORT_HINT = "slowest GPU 7.2 % below the median [/]: rerun it alone to tell"


def _console_text(width: int) -> list[str]:
    checks = [
        Check(name="all_reduce.busbw_gbps", status=Status.PASS, value=354.0, unit="GB/s",
              threshold={"min": 340, "bytes": 2**30}, detail="no hint for a PASS"),
        Check(name="outliers.matmul_pct", status=Status.WARN, value=7.2, unit="%", threshold={"max": 5},
              scope="node:node-a", detail=SHORT_HINT),
        Check(name="membw.h2d_gbps", status=Status.FAIL, value=44.48, unit="GB/s", threshold={"min": 50},
              scope="gpu:node-a/0", detail=LONG_HINT),
    ]  # fmt: skip
    return _printed(checks, width).splitlines()


def _result(checks: list[Check]) -> Result:
    return Result(
        verdict=Status.FAIL, started_at="2026-11-27T00:00:00+00:00", duration_s=1.0, profile="toy",
        world=World(size=2, nodes=1, backend="gloo"), checks=checks,
    )  # fmt: skip


def _printed(checks: list[Check], width: int) -> str:
    """The check table and its verdict line as print_result writes them at `width` columns."""
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_result(_result(checks), console)
    return console.file.getvalue()


def _hints_below(lines: list[str]) -> dict[int, list[str]]:
    """The numbered paragraphs between the table's last border and the verdict: number -> its lines."""
    below = lines[next(i for i, line in enumerate(lines) if line.startswith("└")) + 1 : -1]
    paragraphs: dict[int, list[str]] = {}
    for line in below:
        number, _, text = line.strip().partition(" ")
        if number.isdigit():
            paragraphs[int(number)] = [text]
        else:
            paragraphs[max(paragraphs)].append(line.strip())
    return paragraphs


def test_at_80_columns_the_hints_stand_below_the_table_a_paragraph_each():
    lines = _console_text(80)
    assert max(len(line) for line in lines) <= 80
    assert "why / what to do" not in "\n".join(lines)
    # each row with a hint carries its number, worst first
    assert any(line.startswith("│ FAIL 1 ") and "membw.h2d_gbps" in line for line in lines), lines
    assert any(line.startswith("│ WARN 2 ") and "outliers.matmul_pct" in line for line in lines), lines
    paragraphs = _hints_below(lines)
    assert sorted(paragraphs) == [1, 2]
    assert " ".join(paragraphs[1]) == LONG_HINT and paragraphs[2] == [SHORT_HINT]  # one line where it fits
    for line in paragraphs[1][:-1]:  # a long hint wraps at the console's width, not a word a line
        assert len(line) > 60, paragraphs[1]
    assert "no hint for a PASS" not in "\n".join(lines)
    assert lines[-1] == "FAIL (1 PASS · 1 FAIL · 1 WARN) in 1.0 s"


def test_at_160_columns_the_hints_keep_their_column():
    lines = _console_text(160)
    text = "\n".join(lines)
    assert "why / what to do" in text and max(len(line) for line in lines) <= 160
    (warn,) = [line for line in lines if "outliers.matmul_pct" in line]
    assert warn.startswith("│ WARN ") and SHORT_HINT in warn  # the status alone, the hint on its row
    assert " ".join(text.replace("│", " ").split()).count("check the PCIe link") == 1
    assert not _hints_below(lines)


def test_checks_skipped_for_one_reason_share_its_line_below_the_table():
    """A CPU machine skips ten health checks for want of a driver: one line says so, not ten."""
    no_driver = "no NVIDIA driver on this node (the NVML library is not installed)"
    checks = [
        *(Check(name=name, status=Status.SKIP, scope="node:vm", detail=no_driver) for name in ("ecc", "xid")),
        Check(name="infiniband.state", status=Status.SKIP, scope="node:vm", detail="no InfiniBand port"),
        Check(name="pcie", status=Status.SKIP, scope="node:vm", detail=no_driver),
        Check(name="expect.gpu_count", status=Status.PASS, value=0, unit="GPUs", threshold={"equal": 0}),
    ]
    lines = _printed(checks, 80).splitlines()
    numbered = {line.split("│")[2].strip(): line.split("│")[1].strip() for line in lines if "│ SKIP" in line}
    assert numbered == {"ecc": "SKIP 1", "infiniband.state": "SKIP 2", "pcie": "SKIP 1", "xid": "SKIP 1"}
    assert _hints_below(lines) == {1: [no_driver], 2: ["no InfiniBand port"]}


def test_values_and_bounds_read_without_an_exponent():
    """A GPU's 21,136 tokens/s is '21136', not `.4g`'s '2.114e+04'; small figures keep 4 digits."""
    checks = [
        Check(name="train.tokens_per_s_per_gpu", status=Status.PASS, value=21136.4, unit="tokens/s",
              threshold={"min": 20100}),
        Check(name="membw.copy_tbps", status=Status.PASS, value=0.0045468, unit="TB/s",
              threshold={"min": 0.0005}),
    ]  # fmt: skip
    text = _printed(checks, 120)
    assert "21136 tokens/s" in text and ">= 20100" in text and "e+0" not in text, text
    assert "0.004547 TB/s" in text and ">= 0.0005" in text
    assert "21136 tokens/s" in render_html(_result(checks))
