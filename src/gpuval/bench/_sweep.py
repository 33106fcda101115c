"""A sweep over message sizes as nccl-tests takes it (-b, -e, -f): the options, every size positive and the
smallest no larger than the largest, and the sizes, from a loop that ends whatever the options hold."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator

from gpuval.config import PositiveByteSize

# Steps of a sweep at most: from 1 B at factor 2 they pass units.MAX_BYTES (2**50), the largest size an
# option takes, so the cap only ever ends a sweep that validation should have refused
MAX_STEPS = 64


class SizeSweep(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    min_bytes: PositiveByteSize = Field(description="smallest S")
    max_bytes: PositiveByteSize = Field(description="largest S, at least min_bytes")
    step_factor: StrictInt = Field(2, ge=2, description="S grows by this factor (nccl-tests -f)")
    extra_sizes: list[PositiveByteSize] = Field(
        default_factory=list, description="sizes measured besides the sweep"
    )

    @field_validator("max_bytes")
    @classmethod
    def _not_below_min(cls, largest: int, info: ValidationInfo) -> int:
        smallest = info.data.get("min_bytes")  # absent when min_bytes itself was refused
        if smallest is not None and largest < smallest:
            raise ValueError(f"below min_bytes ({smallest}): give max_bytes >= min_bytes (equal: one size)")
        return largest


def sweep_sizes(options: SizeSweep) -> list[int]:
    """extra_sizes and min_bytes x step_factor**i up to max_bytes, sorted. A bounded loop, not one that
    waits for the size to pass max_bytes: that one never ended from 0 B (issue 50)."""
    sizes = set(options.extra_sizes)
    for step in range(MAX_STEPS):
        size = options.min_bytes * options.step_factor**step
        if size > options.max_bytes:
            break
        sizes.add(size)
    return sorted(sizes)
