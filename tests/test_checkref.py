"""gpuval.checkref: a profile check's name and size, parsed once when the profile is validated."""

from __future__ import annotations

import pytest

from gpuval import derived
from gpuval.checkref import DRIFT, FLEET, SOAK, CheckRef, CheckRefError, family_of, in_family, member_of
from gpuval.config import Profile
from gpuval.results import Measurement


def test_parse_and_render():
    ref = CheckRef.parse("all_reduce.busbw_gbps", 2**30)
    assert (ref.measurement, ref.metric, ref.bytes) == ("all_reduce", "busbw_gbps", 2**30)
    assert str(ref) == ref.name == "all_reduce.busbw_gbps"
    assert ref.where == " at 1 GiB"
    assert CheckRef.parse("outliers.matmul_pct").where == ""


@pytest.mark.parametrize("name", ["matmul", "matmul.", ".x", "a.b.c", "Matmul.x", "a b.c", "a\nb.c", ""])
def test_a_malformed_name_is_one_line_naming_it(name):
    with pytest.raises(CheckRefError, match="must look like '<measurement>.<metric>'") as caught:
        CheckRef.parse(name)
    assert f"'{name}'" in str(caught.value)
    assert CheckRef.read(name) is None


def test_selects_by_name_metric_and_size():
    def m(name="all_reduce", size=4096, **metrics):
        return Measurement(name=name, scope="cluster", params={"bytes": size}, metrics=metrics)

    ref = CheckRef("all_reduce", "busbw_gbps", 4096)
    assert ref.selects(m(busbw_gbps=1.0))
    assert not ref.selects(m(size=8192, busbw_gbps=1.0))
    assert not ref.selects(m(time_us=1.0))
    assert not ref.selects(m(name="all_gather", busbw_gbps=1.0))
    assert CheckRef("all_reduce", "busbw_gbps").selects(m(size=8192, busbw_gbps=1.0))  # no size: every one


def test_a_profile_holds_its_checks_parsed_with_their_sizes_in_order():
    profile = Profile.model_validate(
        {
            "name": "x",
            "checks": {
                "matmul.bf16_tflops": {"min": 1},
                "all_reduce.busbw_gbps": {"min": 2, "bytes": "1MiB"},
                "outliers.matmul_pct": {"max": 5},
            },
        }
    )
    refs = [ref for ref, _ in profile.check_refs()]
    assert refs == [
        CheckRef("matmul", "bf16_tflops"),
        CheckRef("all_reduce", "busbw_gbps", 2**20),
        CheckRef("outliers", "matmul_pct"),
    ]
    assert [t.min or t.max for _, t in profile.check_refs()] == [1, 2, 5]


def test_derived_measurements_are_registered_by_their_own_modules():
    found = derived.all_derived()
    assert {"outliers", "correct"} <= set(found)
    outliers = found["outliers"]
    assert outliers.decl is not None and outliers.decl.name == "outliers"
    assert outliers.source(CheckRef("outliers", "membw_pct")) == "membw"
    assert outliers.source(CheckRef("outliers", "membw")) is None
    assert found["correct"].checks is not None and found["correct"].decl is None
    assert [ref.name for ref, _ in derived.default_checks()] == ["outliers.collectives_pct"]
    assert derived.get("all_reduce") is None


@pytest.mark.parametrize(
    ("family", "member", "name"),
    [
        (DRIFT, "matmul.bf16_tflops", "drift.matmul.bf16_tflops"),  # a check of a check keeps its dots
        (SOAK, "ecc.uncorrected_volatile", "soak.ecc.uncorrected_volatile"),
        (SOAK, "iterations", "soak.iterations"),
        (FLEET, "driver", "fleet.driver"),
        ("matmul", "run", "matmul.run"),
    ],
)
def test_a_family_member_name_reads_back_as_built(family, member, name):
    assert in_family(family, member) == name
    assert member_of(name, family) == member and family_of(name) == family
    assert member_of(name, "other") is None


@pytest.mark.parametrize("name", ["drift", "processes", "drift.", "driftless.x", "gpu.count"])
def test_a_name_of_another_family_or_none_is_no_member(name):
    assert member_of(name, DRIFT) is None
    assert family_of(name) == name.partition(".")[0]
