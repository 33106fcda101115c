"""The torch releases gpuval supports, in one place: pyproject's `dependencies`, the README's "Supported
versions" line and CI's runs are checked against these (tests/test_versions.py).

The floor is the device image's torch (2.11): every API gpuval uses that arrived later is used only
where this torch has it (launch._launch_options, finetune's kernels), and CI runs the multi-rank tests
and the tests of release-dependent code under 2.11 as well as the full suite under 2.13.
docs/torch-versions.md lists which APIs begin where.
"""

from __future__ import annotations

TORCH_LOWEST = (2, 11)  # tested in CI (.ci/run: the multi-rank and torch_version tests)
TORCH_BELOW = (2, 15)  # the first release not yet tested
TORCH_CI = ("2.11.0", "2.13.0")  # what .ci/run installs: the lowest and the main suite's


def _text(version: tuple[int, int]) -> str:
    return ".".join(str(part) for part in version)


def supported_torch() -> str:
    return f"torch >= {_text(TORCH_LOWEST)}, < {_text(TORCH_BELOW)}"


def parse(version: str) -> tuple[int, int]:
    """'2.11.0+cu130' -> (2, 11)."""
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def torch_problem(version: str) -> str | None:
    """Why this torch is outside the supported range, or None."""
    try:
        found = parse(version)
    except (ValueError, IndexError):
        return f"torch {version!r} has a version gpuval cannot read"
    if TORCH_LOWEST <= found < TORCH_BELOW:
        return None
    return f"torch {version} is outside the supported range ({supported_torch()})"
