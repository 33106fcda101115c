"""Byte sizes as people write them, and back; and measured numbers as people read them."""

from __future__ import annotations

import math
import re

# Binary multiples, as nccl-tests reads -b/-e ("1M" = 2**20); an explicit "B" without "i" means decimal.
_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DECIMAL = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
MAX_BYTES = 2**50  # 1 PiB: no message, buffer or memory gpuval sizes is larger
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_bytes(value: int | float | str) -> int:
    """'1GiB' / '1G' -> 2**30, '1GB' -> 10**9, '4096' or 4096 -> 4096."""
    if isinstance(value, bool):
        raise ValueError(f"not a byte size: {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0 or value > MAX_BYTES or int(value) != value:
            raise ValueError(f"not a byte size: {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"not a byte size: {value!r} (write e.g. 4096, 64MiB, 1GiB)")
    match = _PATTERN.match(value)
    if not match:
        raise ValueError(f"not a byte size: {value!r} (write e.g. 4096, 64MiB, 1GiB)")
    number, prefix, suffix = match.group(1), match.group(2).upper(), (match.group(3) or "").upper()
    if suffix == "IB" and not prefix:  # '1iB': a binary marker with no multiple to mark, likely a typo
        raise ValueError(f"not a byte size: {value!r} (write e.g. 4096, 64MiB, 1GiB)")
    factor = _DECIMAL[prefix + "B"] if suffix == "B" and prefix else _BINARY[prefix]
    result = float(number) * factor
    if not math.isfinite(result) or result > MAX_BYTES:
        raise ValueError(f"byte size {value!r} is too large (at most 1 PiB)")
    if result != int(result):
        raise ValueError(f"not a whole number of bytes: {value!r}")
    return int(result)


def format_bytes(count: int) -> str:
    """4096 -> '4 KiB', 1073741824 -> '1 GiB', 1000 -> '1000 B'."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= factor and count % factor == 0:
            return f"{count // factor} {unit}"
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= factor:
            return f"{count / factor:.1f} {unit}"
    return f"{count} B"


def format_number(value: float) -> str:
    """A measured value with 4 significant digits and never an exponent from 0.001 up: 21136.4 ->
    '21136', 1.95683 -> '1.957', 0.004547 -> '0.004547' (`.4g` alone writes 21136.4 as '2.114e+04')."""
    if math.isfinite(value) and abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"
