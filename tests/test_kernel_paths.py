"""The numerical tests again on the CPU's other kernel paths (issue 48).

PyTorch picks its own vectorised kernels by ATEN_CPU_CAPABILITY, MKL its matrix products by
MKL_ENABLE_INSTRUCTIONS and oneDNN its kernels by ONEDNN_MAX_CPU_ISA; which ones run is what differs between
an AVX-512 Xeon, an AMD EPYC and an AVX2 laptop, and each adds the same terms in its own order. A comparison
that holds only on this machine's kernels fails on another's: here the numerical tests run again in a child
pytest on each other path, which checks at its start that torch took the path (conftest's
GPUVAL_EXPECT_CPU_CAPABILITY) and must pass. The machine's own path is the rest of the suite's run.

Which tests: the comparisons themselves (fewer rows against all rows, fused against unfused, chunked, sharded,
FP8 on the CPU, packed against alone; in-process, the modules' quick tier) and two of the short trainings
against transformers + PEFT (test_finetune_equivalence.py). Left out: the slower trainings that reuse those
comparisons, inductor's compiled tests (C++ builds) and the multi-rank runs (torchrun: not about kernels).
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from conftest import EXPECT_CPU_CAPABILITY, cli_env, module_path  # noqa: E402

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent

# path -> (what torch.backends.cpu.get_cpu_capability() must say, the variables that choose it)
KERNEL_PATHS = {
    "avx2": (
        "AVX2",
        {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    ),
    "default": (
        "DEFAULT",
        {
            "ATEN_CPU_CAPABILITY": "default",
            "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
            "ONEDNN_MAX_CPU_ISA": "SSE41",
        },
    ),
}
CAPABILITY_ORDER = ("DEFAULT", "AVX2", "AVX512")  # x86-64's paths, each needing the one before

# The modules of the comparisons (their quick tier: `not slow`) and of the trainings against transformers +
# PEFT (test_finetune_equivalence.py, all slow: its default step and every CPU switch at once; the other ten
# switch sets, each of them inside all-on, would add 40 s (AVX2) to 80 s (default kernels) of CPU a path).
COMPARISONS = (
    "test_finetune_kernels.py",
    "test_finetune_fused_mlp.py",
    "test_finetune_fused_qkv.py",
    "test_finetune_sharding.py",
    "test_finetune_fp8.py",
    "test_finetune_linear_ce.py",
    "test_finetune_split_products.py",
    "test_finetune_packing.py",
    "test_finetune_flash4.py",
)
EQUIVALENCE = "test_finetune_equivalence.py"
# One child pytest a path for both (each child's start, imports and collection cost ~5 CPU-s): `-k` matches
# the markers, the module and the test's name and parameters.
SELECTION = ["-k", "not slow or (test_finetune_equivalence and (baseline or all-on))"]


def _has(capability: str) -> bool:
    """Whether this CPU runs torch's `capability` kernels (the highest it has is what torch picked)."""
    here = torch.backends.cpu.get_cpu_capability()
    return here in CAPABILITY_ORDER and CAPABILITY_ORDER.index(here) >= CAPABILITY_ORDER.index(capability)


def _child_pytest(
    tests: list[str], options: list[str], variables: dict[str, str], basetemp: Path
) -> subprocess.CompletedProcess[str]:
    """pytest on `tests` in a child process with `variables` set: one process (this test is one worker's),
    no cache, and a temporary folder of its own (pytest removes old ones from the shared folder, which would
    take a running parent's). No pytest or xdist variable of this run reaches it. Inductor's cache is the
    child's own: torch 2.13 keys no entry by ATEN_CPU_CAPABILITY, so a kernel built for one path and loaded
    on another computes wrong values (seen: `x * 2` compiled on AVX-512, reloaded under avx2)."""
    env = {key: value for key, value in cli_env().items() if not key.startswith(("PYTEST_", "GPUVAL_TESTS_"))}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(basetemp.parent / "inductor")
    env.update(variables)
    command = [sys.executable, "-m", "pytest", *(str(module_path(t)) for t in tests), *options]
    command += ["-n", "0", "-p", "no:cacheprovider", "-q", f"--basetemp={basetemp}"]
    return subprocess.run(command, cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64's kernel paths")
@pytest.mark.parametrize("path", list(KERNEL_PATHS))
def test_the_numerical_tests_pass_on_another_kernel_path(path, tmp_path):
    capability, variables = KERNEL_PATHS[path]
    if not _has(capability):
        pytest.skip(f"this CPU has no {capability} kernels")
    if torch.backends.cpu.get_cpu_capability() == capability:
        pytest.skip(f"{capability} is this CPU's own path, which the rest of this run takes")
    proc = _child_pytest(
        [*COMPARISONS, EQUIVALENCE],
        SELECTION,
        {**variables, EXPECT_CPU_CAPABILITY: capability},
        tmp_path / "basetemp",
    )
    output = proc.stdout + proc.stderr
    chosen = " ".join(f"{key}={value}" for key, value in variables.items())
    assert proc.returncode == 0, f"{path} kernels ({chosen}):\n{output[-6000:]}"
    assert " passed" in output.splitlines()[-1], output[-2000:]  # something ran


def test_a_run_on_another_path_than_expected_stops_before_any_test(tmp_path):
    """The child's check (conftest._check_kernel_path) is real: a path torch did not take stops the run."""
    proc = _child_pytest(
        ["test_finetune_linear_ce.py"], [], {EXPECT_CPU_CAPABILITY: "NO_SUCH_PATH"}, tmp_path / "basetemp"
    )
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert f"{EXPECT_CPU_CAPABILITY}=NO_SUCH_PATH, but torch runs its" in proc.stderr, proc.stderr
    assert " passed" not in proc.stdout
