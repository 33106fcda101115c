"""Profiles: built-ins load, bad YAML and unknown keys are readable UsageErrors, --set overrides, sizes."""

from __future__ import annotations

import pytest

from gpuval.config import (
    Profile,
    apply_sets,
    builtin_profiles,
    load_profile,
    parse_set,
    pick_profile,
    resolve_profile_path,
)
from gpuval.errors import EXIT_USAGE, UsageError
from gpuval.units import format_bytes, parse_bytes

# --- built-in profiles ----------------------------------------------------------------------------


def test_the_three_builtin_profiles_are_shipped():
    assert builtin_profiles() == ["cpu", "h100-sxm", "h200-sxm"]


@pytest.mark.parametrize("name", ["cpu", "h100-sxm", "h200-sxm"])
def test_builtin_profile_loads_and_is_named_after_its_file(name):
    profile = load_profile(name)
    assert isinstance(profile, Profile)
    assert profile.name == name
    assert profile.description
    assert profile.checks, "a profile without checks judges nothing"
    for check, threshold in profile.checks.items():
        assert threshold.flat or threshold.by_gpus, f"{name}: {check} has no bound"


def test_cpu_profile_values():
    profile = load_profile("cpu")
    assert profile.expect.gpu_count == 0
    assert profile.runtime.timeout_s == 120
    assert profile.checks["all_reduce.busbw_gbps"].bytes == 2**20  # '1MiB' read as a byte size
    assert profile.checks["outliers.matmul_pct"].level == "warn"


@pytest.mark.parametrize(
    "name, count, gpu, gib, all_reduce_bytes",
    [
        ("h100-sxm", 8, "NVIDIA H100 80GB HBM3", 79, 2**30),
        ("h200-sxm", 8, "NVIDIA H200", 139, 2**30),
    ],
)
def test_gpu_profiles_expect_section(name, count, gpu, gib, all_reduce_bytes):
    profile = load_profile(name)
    assert profile.expect.gpu_count == count
    assert profile.expect.gpu_name == gpu
    assert profile.expect.gpu_memory_gib == gib
    assert profile.checks["all_reduce.busbw_gbps"].bytes == all_reduce_bytes


def test_profile_loads_from_a_file_path(write_profile):
    path = write_profile("name: mine\nchecks:\n  matmul.fp32_tflops: {min: 0.5}\n")
    profile = load_profile(str(path))
    assert profile.name == "mine"
    assert profile.checks["matmul.fp32_tflops"].min == 0.5
    assert profile.checks["matmul.fp32_tflops"].level == "fail"
    assert profile.runtime.timeout_s == 300.0  # default


# --- unknown keys, wrong values, broken YAML: one-line usage errors -------------------------------


def _usage_error(*args, **kwargs) -> str:
    with pytest.raises(UsageError) as info:
        load_profile(*args, **kwargs)
    assert info.value.exit_code == EXIT_USAGE
    message = str(info.value)
    assert "\n" not in message, "a usage error is one line"
    return message


@pytest.mark.parametrize(
    "text, fragments",
    [
        # unknown keys: named with their path, and a suggestion or the known keys
        pytest.param(
            "name: x\nchekcs: {}\n",
            ["unknown key 'chekcs'", "did you mean 'checks'"],
            id="unknown-top-level-key-suggests",
        ),
        pytest.param(
            "name: x\nzzzz: 1\n",
            [
                "unknown key 'zzzz'",
                "known keys: benchmarks, checks, description, expect, health, history, name, runtime",
            ],
            id="unknown-top-level-key-without-a-close-match-lists-the-known-keys",
        ),
        pytest.param(
            "name: x\nexpect:\n  gpu_cout: 8\n",
            ["unknown key 'expect.gpu_cout'", "did you mean 'gpu_count'"],
            id="unknown-nested-key-in-expect",
        ),
        pytest.param(
            "name: x\nchecks:\n  matmul.bf16_tflops: {mni: 700}\n",
            ["unknown key 'checks.matmul.bf16_tflops.mni'", "did you mean 'min'"],
            id="unknown-key-inside-a-check-threshold",
        ),
        pytest.param(
            "name: x\nruntime:\n  timeout: 10\n",
            ["unknown key 'runtime.timeout'", "did you mean 'timeout_s'"],
            id="unknown-key-in-runtime",
        ),
        # missing or wrong values
        pytest.param("checks: {}\n", ["missing key 'name'"], id="missing-name"),
        pytest.param(
            "name: x\nchecks:\n  matmul: {min: 1}\n",
            ["'matmul'", "<measurement>.<metric>"],
            id="badly-formed-check-name",
        ),
        pytest.param("name: x\nexpect:\n  gpu_count: true\n", ["'expect.gpu_count'"], id="boolean-gpu-count"),
        pytest.param(
            "name: x\nexpect:\n  gpu_count: eight\n",
            ["'expect.gpu_count'", "'eight'"],
            id="wrong-value-type-names-the-key",
        ),
        # broken YAML; line 3: '  gpu_count: 8: 9' - the second ':' is at column 15 (1-based)
        pytest.param(
            "name: x\nexpect:\n  gpu_count: 8: 9\n",
            ["broken YAML at line 3, column 15", "mapping values are not allowed here"],
            id="broken-yaml-names-line-and-column",
        ),
        pytest.param(
            "name: x\n\tchecks: {}\n", ["broken YAML at line 2, column 1"], id="broken-yaml-tab-indent"
        ),
    ],
)
def test_bad_profile_names_the_problem(write_profile, text, fragments):
    message = _usage_error(str(write_profile(text)))
    for fragment in fragments:
        assert fragment in message


def test_error_names_the_profile_file(write_profile):
    path = write_profile("name: x\nexpect:\n  gpu_cout: 8\n", "named.yaml")
    assert str(path) in _usage_error(str(path))


def test_badly_formed_check_name_message_is_one_short_line(write_profile):
    message = _usage_error(str(write_profile("name: x\nchecks:\n  matmul: {min: 1}\n")))
    assert "{" not in message  # the whole checks mapping is not dumped into the message


# --- not a mapping, missing files, unknown names --------------------------------------------------


@pytest.mark.parametrize("text, kind", [("", "NoneType"), ("- a\n- b\n", "list"), ("just a string\n", "str")])
def test_yaml_that_is_not_a_mapping(write_profile, text, kind):
    message = _usage_error(str(write_profile(text)))
    assert "expected a mapping" in message
    assert kind in message


def test_missing_profile_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    message = _usage_error(str(missing))
    assert str(missing) in message
    assert "does not exist" in message


def test_missing_profile_path_without_yaml_suffix(tmp_path):
    message = _usage_error(str(tmp_path / "profiles" / "nope"))
    assert "does not exist" in message


def test_profile_path_that_is_a_directory(tmp_path):
    directory = tmp_path / "dir.yaml"
    directory.mkdir()
    message = _usage_error(str(directory))
    assert "cannot read it" in message


@pytest.mark.parametrize(
    "typo, suggestion", [("cpuu", "cpu"), ("h200", "h200-sxm"), ("h100-sxn", "h100-sxm")]
)
def test_unknown_profile_name_suggests_a_builtin(typo, suggestion):
    message = _usage_error(typo)
    assert f"unknown profile '{typo}'" in message
    assert f"did you mean '{suggestion}'" in message
    assert "cpu, h100-sxm, h200-sxm" in message


def test_unknown_profile_name_without_a_close_match_lists_builtins():
    message = _usage_error("zzzzzzzz")
    assert "did you mean" not in message
    assert "built-in profiles: cpu, h100-sxm, h200-sxm" in message


def test_builtin_name_resolves_to_the_shipped_file():
    path = resolve_profile_path("h200-sxm")
    assert path.name == "h200-sxm.yaml"
    assert path.is_file()


# --- --set overrides ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment, parts, value",
    [
        ("expect.gpu_count=8", ["expect", "gpu_count"], 8),
        ("a.b=true", ["a", "b"], True),
        ("a.b=false", ["a", "b"], False),
        ("a.b=0.5", ["a", "b"], 0.5),
        ("a.b=1GiB", ["a", "b"], "1GiB"),
        ("a.b=[1, 2]", ["a", "b"], [1, 2]),
        ("a.b={min: 5}", ["a", "b"], {"min": 5}),
        ("a.b=", ["a", "b"], ""),
        ("a.b=x=y", ["a", "b"], "x=y"),  # only the first '=' separates key from value
        (" a.b =7", ["a", "b"], 7),
        ("a.b=[unclosed", ["a", "b"], "[unclosed"),  # not YAML: kept as the raw string
    ],
)
def test_parse_set_reads_values_as_yaml_scalars(assignment, parts, value):
    assert parse_set(assignment) == (parts, value)


@pytest.mark.parametrize(
    "assignment, fragment",
    [("expect.gpu_count", "key.path=value"), ("=3", "key is empty"), ("...=3", "key is empty")],
)
def test_parse_set_rejects_malformed_assignments(assignment, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse_set(assignment)


def test_apply_sets_creates_sections_and_joins_dotted_check_names():
    data: dict = {"name": "x"}
    apply_sets(
        data, ["expect.gpu_count=4", "checks.all_reduce.busbw_gbps.min=5", "benchmarks.matmul.repeats=2"]
    )
    assert data == {
        "name": "x",
        "expect": {"gpu_count": 4},
        "checks": {"all_reduce.busbw_gbps": {"min": 5}},
        "benchmarks": {"matmul": {"repeats": 2}},
    }


def test_apply_sets_refuses_to_descend_into_a_value():
    with pytest.raises(UsageError, match="'name' is a value, not a section"):
        apply_sets({"name": "x"}, ["name.first=y"])


def test_set_int_override():
    assert load_profile("cpu", ["expect.gpu_count=8"]).expect.gpu_count == 8


def test_set_string_and_float_overrides():
    profile = load_profile("cpu", ["expect.gpu_name=NVIDIA H200", "runtime.timeout_s=30", "name=renamed"])
    assert profile.expect.gpu_name == "NVIDIA H200"
    assert profile.runtime.timeout_s == 30.0
    assert profile.name == "renamed"


def test_set_bool_override_reaches_benchmark_options():
    # Profile fields hold no bools; benchmark options are free-form until planned, so the YAML bool survives.
    profile = load_profile("cpu", ["benchmarks.collectives.flag=true", "benchmarks.collectives.other=no"])
    assert profile.benchmarks["collectives"] == {"flag": True, "other": False}


def test_set_dotted_check_name_keeps_the_rest_of_the_threshold():
    profile = load_profile("cpu", ["checks.all_reduce.busbw_gbps.min=5"])
    threshold = profile.checks["all_reduce.busbw_gbps"]
    assert threshold.min == 5.0
    assert threshold.bytes == 2**20  # from cpu.yaml, untouched
    assert profile.checks["all_gather.busbw_gbps"].min == 0.01  # the other checks are untouched


def test_set_byte_size():
    profile = load_profile(
        "cpu", ["checks.all_reduce.busbw_gbps.bytes=1GiB", "checks.all_gather.busbw_gbps.bytes=1GB"]
    )
    assert profile.checks["all_reduce.busbw_gbps"].bytes == 2**30
    assert profile.checks["all_gather.busbw_gbps"].bytes == 10**9


def test_set_adds_a_new_check_and_a_whole_threshold():
    profile = load_profile("cpu", ["checks.membw.read_tbps.min=0.001", "checks.membw.write_tbps={max: 9}"])
    assert profile.checks["membw.read_tbps"].min == 0.001
    assert profile.checks["membw.write_tbps"].max == 9.0


def test_set_float_in_exponent_form():
    # YAML 1.1 reads '1e9' as a string; the threshold still takes it as the number 1e9
    assert load_profile("cpu", ["checks.matmul.fp32_tflops.min=1e9"]).checks["matmul.fp32_tflops"].min == 1e9


def test_later_set_wins():
    assert load_profile("cpu", ["expect.gpu_count=2", "expect.gpu_count=3"]).expect.gpu_count == 3


def test_set_does_not_leak_into_the_next_load():
    load_profile("cpu", ["expect.gpu_count=8"])
    assert load_profile("cpu").expect.gpu_count == 0


@pytest.mark.parametrize(
    "assignment, key",
    [
        ("expect.gpu_count=many", "'expect.gpu_count'"),
        ("expect.gpu_count=-1", "'expect.gpu_count'"),
        ("runtime.timeout_s=0", "'runtime.timeout_s'"),
        ("checks.all_reduce.busbw_gbps.bytes=lots", "'checks.all_reduce.busbw_gbps.bytes'"),
        ("checks.all_reduce.busbw_gbps.min=fast", "'checks.all_reduce.busbw_gbps.min'"),
        ("checks.matmul.fp32_tflops.level=error", "'checks.matmul.fp32_tflops.level'"),
        ("checks.matmul.fp32_tflops=3", "'checks.matmul.fp32_tflops'"),
    ],
)
def test_set_wrong_type_names_the_key(assignment, key):
    message = _usage_error("cpu", [assignment])
    assert key in message
    assert "cpu.yaml" in message


@pytest.mark.parametrize(
    "assignment, key, suggestion",
    [
        ("checks.matmul.fp32_tflops.mni=3", "checks.matmul.fp32_tflops.mni", "min"),
        ("expect.gpu_cout=3", "expect.gpu_cout", "gpu_count"),
    ],
)
def test_set_unknown_key_names_it_with_a_suggestion(assignment, key, suggestion):
    message = _usage_error("cpu", [assignment])
    assert f"unknown key '{key}'" in message
    assert f"did you mean '{suggestion}'" in message


# --- byte sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1GiB", 2**30),
        ("1G", 2**30),
        ("1GB", 10**9),
        ("64M", 64 * 2**20),
        ("64MiB", 2**26),
        ("64mib", 2**26),
        ("64MB", 64 * 10**6),
        ("4096", 4096),
        ("4K", 4096),
        ("1KB", 1000),
        ("1 KiB", 1024),
        ("  2TiB ", 2 * 2**40),
        ("1TB", 10**12),
        ("1.5KiB", 1536),
        ("0.5GiB", 2**29),
        ("0", 0),
        ("3B", 3),
        (4096, 4096),
        (2.0, 2),
    ],
)
def test_parse_bytes(text, expected):
    value = parse_bytes(text)
    assert value == expected
    assert isinstance(value, int)


@pytest.mark.parametrize(
    "bad", ["", "GiB", "1XB", "-1", "1.5", "1.3KiB", "lots", "1 GiB extra", "1e9", -1, 1.5, True, "1iB"]
)
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


@pytest.mark.parametrize(
    "count, text",
    [
        (0, "0 B"),
        (1000, "1000 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (4096, "4 KiB"),
        (1536, "1.5 KiB"),
        (2**20, "1 MiB"),
        (2**26, "64 MiB"),
        (2**30, "1 GiB"),
        (10**9, "953.7 MiB"),
        (3 * 2**40, "3 TiB"),
    ],
)
def test_format_bytes(count, text):
    assert format_bytes(count) == text


@pytest.mark.parametrize("count", [1, 4096, 2**20, 64 * 2**20, 2**30, 2**32, 2**40])
def test_format_then_parse_round_trips_whole_units(count):
    assert parse_bytes(format_bytes(count).replace(" ", "")) == count


# --- picking a profile for the local hardware -----------------------------------------------------


@pytest.mark.parametrize(
    "gpus, profile",
    [
        pytest.param([], "cpu", id="without-gpus-is-cpu"),
        pytest.param(["NVIDIA H200"] * 8, "h200-sxm", id="h200"),
        pytest.param(["NVIDIA H100 80GB HBM3"] * 8, "h100-sxm", id="h100"),
    ],
)
def test_pick_profile(gpus, profile):
    assert pick_profile(gpus) == profile


@pytest.mark.parametrize(
    "gpus",
    [
        ["NVIDIA H200 NVL"],
        ["NVIDIA H100 PCIe"],
        ["NVIDIA H200", "NVIDIA H100 80GB HBM3"],
        ["NVIDIA A100-SXM4-80GB"],
    ],
)
def test_pick_profile_without_a_match_is_a_usage_error(gpus):
    with pytest.raises(UsageError) as info:
        pick_profile(gpus)
    message = str(info.value)
    assert gpus[0] in message
    assert "--profile" in message


@pytest.mark.parametrize(
    "pci_ids, profile",
    [
        pytest.param(["10de:2330"] * 8, "h100-sxm", id="h100-sxm5"),
        pytest.param(["10de:2335"] * 4, "h200-sxm", id="h200-sxm"),
        pytest.param(["10DE:2335"], "h200-sxm", id="either-case"),
    ],
)
def test_pick_profile_by_pci_id_when_nvml_cannot_name_the_gpus(pci_ids, profile):
    """A node whose driver is not loaded still holds its GPUs: never the cpu profile for it."""
    assert pick_profile([], pci_ids) == profile
    assert pick_profile(["NVIDIA H100 80GB HBM3"], pci_ids) == "h100-sxm"  # names NVML gives come first


@pytest.mark.parametrize(
    "pci_ids, shown",
    [
        pytest.param(["10de:2331"] * 8, "8x 10de:2331", id="h100-pcie"),
        pytest.param(["10de:2330", "10de:2335"], "1x 10de:2330, 1x 10de:2335", id="mixed"),
    ],
)
def test_pick_profile_with_unknown_pci_ids_is_a_usage_error_naming_them(pci_ids, shown):
    with pytest.raises(UsageError) as info:
        pick_profile([], pci_ids)
    assert str(info.value) == (
        f"NVML cannot name the GPUs here and no built-in profile matches their PCI ids ({shown}); pass "
        "--profile NAME or FILE (built-in: cpu, h100-sxm, h200-sxm)"
    )


@pytest.mark.parametrize("recording, name", [("h100x1", "h100-sxm"), ("h200x2", "h200-sxm")])
def test_builtin_pci_ids_are_what_nvml_reported_on_the_lent_machines(recording, name):
    """nvmlDeviceGetPciInfo's pciDeviceId is (device << 16) | vendor: 0x233010de on the H100."""
    from nvml_replay import load

    ids = {device["nvmlDeviceGetPciInfo"]["pciDeviceId"] for device in load(recording)["devices"]}
    assert [f"{i & 0xFFFF:04x}:{i >> 16:04x}" for i in ids] == load_profile(name).expect.pci_ids


def test_pci_ids_must_look_like_lspci_prints_them():
    with pytest.raises(UsageError, match="expect.pci_ids.0"):
        load_profile("h100-sxm", ["expect.pci_ids=[0x2330]"])
