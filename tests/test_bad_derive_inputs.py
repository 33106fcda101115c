"""`gpuval profiles derive` on bad input (issue 50): result documents of another shape or with values no
measurement gives, a non-finite --k, a run whose name a profile cannot hold, and a manifest whose second
profile fails. The promise: a profile derived with finite bounds that loads back, or a refusal (UsageError,
one `gpuval:` line, exit 2) naming the file and the field; never exit 3 ("internal error"), never a
traceback, and nothing half-written.

Property tests call the derivation in this process (load_run, base_for, derive_profile, as the command does)
on clean CPU runs built from the real result model (test_derive_robust.cpu_run), one place of them broken;
a few cases run the CLI as a child process, as users run it.
"""

from __future__ import annotations

import json
import math
import tempfile
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_derive_robust import cpu_run
from test_fuzz_inputs import assert_clean, invoke, mutated, values

from gpuval import atomic
from gpuval.config import load_profile
from gpuval.derive import Rule, base_for, derive_profile
from gpuval.derive_runs import LARGEST_VALUE, LEAST_VALUE, load_run
from gpuval.errors import UsageError
from gpuval.inputs import MAX_INT
from gpuval.result_files import find_result_files

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    database=None,  # no .hypothesis/ folder left behind
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# test_derive_robust's three clean 2-rank CPU runs: node, fp32 TFLOP/s, memcpy TB/s, busbw, tokens/s, gap %
CLEAN = [
    ("cpu-1", [0.070, 0.072], [0.0104, 0.0218], 1.0, 2400.0, 1.0),
    ("cpu-2", [0.068, 0.070], [0.0150, 0.0180], 1.1, 2500.0, 2.0),
    ("cpu-1", [0.071, 0.069], [0.0120, 0.0200], 1.2, 2450.0, 3.0),
]
METRICS = ("fp32_tflops", "copy_tbps", "busbw_gbps", "tokens_per_s_per_gpu", "matmul_pct")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The three clean runs' documents, as cpu_run writes them."""
    folder = tmp_path_factory.mktemp("clean")
    paths = [cpu_run(folder / f"{index}.json", *run) for index, run in enumerate(CLEAN)]
    return [json.loads(path.read_text(encoding="utf-8")) for path in paths]


def documents(clean: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return json.loads(json.dumps(clean))  # a deep copy to break


def derive_or_refuse(
    docs: list[Any], parent: Path, rule: Rule | None = None, label: str | None = None
) -> str:
    """Derive from `docs` as `profiles derive` does, in this process: '' where a profile came out (every floor
    finite and above 0, every ceiling finite, its text loading back as a profile), else the refusal. Any
    exception but a UsageError fails the test: the CLI would call it an internal error (exit 3)."""
    folder = Path(tempfile.mkdtemp(dir=parent))  # hypothesis runs every case of a test in one tmp_path
    for index, doc in enumerate(docs):
        (folder / f"run-{index}").mkdir()
        # allow_nan: NaN and Infinity as a careless writer puts them (gpuval.inputs refuses them)
        (folder / f"run-{index}" / "result.json").write_text(
            json.dumps(doc, allow_nan=True), encoding="utf-8"
        )
    try:
        paths = find_result_files([folder])
        runs = [load_run(path, label=label if index == 0 else None) for index, path in enumerate(paths)]
        text, _, _ = derive_profile(base_for(runs, None), runs, rule or Rule())
    except UsageError as exc:
        assert str(exc).strip(), "a refusal says what is wrong"
        return str(exc)
    written = folder / "derived.yaml"
    written.write_text(text, encoding="utf-8")
    for name, threshold in load_profile(str(written)).checks.items():
        for bound in [threshold, *(threshold.by_gpus or {}).values()]:
            assert bound.min is None or (math.isfinite(bound.min) and bound.min > 0), (name, bound)
            assert bound.max is None or math.isfinite(bound.max), (name, bound)
    return ""


def test_the_clean_runs_derive(clean, tmp_path):
    assert derive_or_refuse(documents(clean), tmp_path) == ""


# ---- metric values: booleans and text are no numbers, nor are sizes no measurement has ---------------------

NUMBERS = st.one_of(
    st.floats(),  # subnormals, 1e308, NaN and infinities among them
    st.sampled_from(
        [5e-324, 2.2250738585072014e-308, 1e-101, 1e-100, 1e100, 1e101, 1e308, -1e308, 0.0, -0.0]
    ),
    st.integers(min_value=-(2**70), max_value=2**70),
)
METRIC_VALUES = st.one_of(NUMBERS, st.booleans(), st.none(), st.text(max_size=4))


def _sized(value: Any) -> bool:
    """A number a run may hold (gpuval.derive_runs' bounds on a value's size)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value == 0 or LEAST_VALUE <= abs(value) <= LARGEST_VALUE


def _no_json(value: Any) -> bool:
    """A number the JSON gate refuses before any field is read (gpuval.inputs): it names the file alone."""
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT


@PROPERTY
@given(key=st.sampled_from(METRICS), value=METRIC_VALUES, every_run=st.booleans())
@example(key="fp32_tflops", value=1e308, every_run=True)  # a floor past the floats: OverflowError
@example(key="busbw_gbps", value=1e308, every_run=True)
@example(key="matmul_pct", value=1e308, every_run=True)
@example(key="fp32_tflops", value=5e-324, every_run=True)
@example(key="fp32_tflops", value=True, every_run=False)  # read as 1.0
def test_a_metric_value_derives_or_is_refused_naming_the_file_and_the_field(
    clean, tmp_path, key, value, every_run
):
    docs = documents(clean)
    for doc in docs if every_run else docs[:1]:
        for measurement in doc["measurements"]:
            if key in measurement["metrics"]:
                measurement["metrics"][key] = value
    refused = derive_or_refuse(docs, tmp_path)
    if value is not None and not _sized(value):
        assert "run-0/result.json" in refused, refused
        assert _no_json(value) or f"metrics.{key}" in refused, refused


SIZED = st.one_of(
    st.just(0.0),
    st.floats(min_value=LEAST_VALUE, max_value=LARGEST_VALUE),
    st.floats(min_value=-LARGEST_VALUE, max_value=-LEAST_VALUE),
)


@PROPERTY
@given(fp32=st.lists(SIZED, min_size=6, max_size=6), gaps=st.lists(SIZED, min_size=3, max_size=3))
@example(fp32=[1e100, 1e-100, 1e100, 1e-100, 1e100, 1e-100], gaps=[1e-100, 1e100, 0.0])
@example(fp32=[1e20] * 6, gaps=[1.0, 2.0, 3.0])  # a floor written as 97000000000000000000: past MAX_INT
def test_values_of_any_size_a_run_may_hold_derive_or_are_refused(clean, tmp_path, fp32, gaps):
    """A floor (fp32, higher is better) and a ceiling (the outlier gap) from values far apart in size."""
    docs = documents(clean)
    floors, ceilings = iter(fp32), iter(gaps)
    for doc in docs:
        for measurement in doc["measurements"]:
            metrics = measurement["metrics"]
            if "fp32_tflops" in metrics:
                metrics["fp32_tflops"] = next(floors)
            if "matmul_pct" in metrics:
                metrics["matmul_pct"] = next(ceilings)
    derive_or_refuse(docs, tmp_path)


# ---- the inventory: the shape gpuval discover writes -------------------------------------------------------

PLACES = [
    ("inventory",),
    ("inventory", "nodes"),
    ("inventory", "nodes", 0),
    ("inventory", "nodes", 0, "gpus"),
    ("inventory", "nodes", 0, "gpus", 0),
    ("inventory", "nodes", 0, "gpus", 0, "name"),
    ("inventory", "nodes", 0, "gpus", 0, "uuid"),
    ("inventory", "nodes", 0, "host"),
    ("inventory", "nodes", 0, "host", "hostname"),
    ("inventory", "nodes", 0, "node"),
]


@PROPERTY
@given(place=st.sampled_from(PLACES), value=values)
@example(place=("inventory", "nodes"), value=5)
@example(place=("inventory", "nodes", 0, "gpus"), value=["a", "b"])
@example(place=("inventory", "nodes", 0, "host"), value="vm")
def test_an_inventory_of_another_shape_derives_or_is_refused(clean, tmp_path, place, value):
    docs = documents(clean)
    for doc in docs:
        doc["inventory"]["nodes"][0]["gpus"] = [{"name": "cpu", "uuid": "GPU-1"}]
    parent = docs[0]
    for part in place[:-1]:
        parent = parent[part]
    parent[place[-1]] = value
    refused = derive_or_refuse(docs, tmp_path)
    if place == ("inventory", "nodes") and not isinstance(value, list | None):
        assert "run-0/result.json" in refused, refused
        # the JSON gate's refusal of what is no JSON number (NaN, 2**63) comes first, naming the file alone
        assert "inventory.nodes" in refused or refused.startswith("result file '"), refused


@PROPERTY
@given(data=st.data())
def test_any_few_places_of_the_runs_broken_derive_or_are_refused(clean, tmp_path, data):
    docs = documents(clean)
    for index in data.draw(st.sets(st.integers(0, len(docs) - 1), min_size=1)):
        docs[index] = data.draw(mutated(docs[index]))
    derive_or_refuse(docs, tmp_path)


# ---- a collective's rank count: 1 or more ------------------------------------------------------------------


@PROPERTY
@given(
    ranks=st.one_of(
        st.integers(-3, 9),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=3),
    )
)
@example(ranks=0)  # by_gpus {0: ...}: a raw pydantic ValidationError
@example(ranks=-2)
def test_a_rank_count_derives_or_is_refused_naming_the_field(clean, tmp_path, ranks):
    docs = documents(clean)
    for doc in docs:
        for measurement in doc["measurements"]:
            if "ranks" in measurement["params"]:
                measurement["params"]["ranks"] = ranks
    refused = derive_or_refuse(docs, tmp_path)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        assert "params.ranks" in refused, refused


# ---- the rule's k and margin -------------------------------------------------------------------------------


@PROPERTY
@given(k=st.floats(), margin=st.floats(min_value=-1, max_value=2))
@example(k=math.inf, margin=0.03)  # a floor of 0 written, or an OverflowError
@example(k=math.nan, margin=0.03)
@example(k=1e308, margin=0.03)  # finite, but k x sd is not
def test_any_k_and_margin_derive_or_are_refused(clean, tmp_path, k, margin):
    try:
        rule = Rule(k=k, margin=margin)
    except UsageError as exc:
        assert not (math.isfinite(k) and k >= 0 and 0 <= margin < 1), (k, margin)
        assert "--k" in str(exc) or "--margin" in str(exc)
        return
    derive_or_refuse(documents(clean), tmp_path, rule)


# ---- a run's name: every bound's source lists it -----------------------------------------------------------


@PROPERTY
@given(label=st.text(st.characters(blacklist_categories=()), min_size=1, max_size=12))
@example(label="runs/a\nb/result.json")  # a source folded at the newline: did not read back (exit 3)
@example(label="run\u2028one")
@example(label="run-\udcff")  # an undecodable byte of a path
@example(label="run-\ufffe")
def test_a_run_name_a_profile_can_hold_derives_and_another_is_refused(clean, tmp_path, label):
    refused = derive_or_refuse(documents(clean), tmp_path, label=label)
    # what ends a line, what YAML cannot hold (lone surrogates, U+FFFE/F): the rest is written as it is
    unnameable = any(
        unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") or c in "\ufffe\uffff" for c in label
    )
    assert ("its name holds" in refused) if unnameable else refused == "", refused


# ---- the command, as users run it --------------------------------------------------------------------------


def _write_runs(clean: list[dict[str, Any]], folder: Path) -> list[Path]:
    paths = []
    for index, doc in enumerate(clean):
        path = folder / f"task-{index}" / "result.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc), encoding="utf-8")
        paths.append(path)
    return paths


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("nodes: 5", "inventory.nodes: Input should be a valid list"),
        ("a true metric", "metrics.fp32_tflops: true is not a number"),
        ("1e308", "metrics.fp32_tflops is 1e+308"),
        ("ranks 0", "params.ranks is 0"),
        ("--k inf", "--k inf: give a finite number"),
        ("a newline in the path", "its name holds '\\n'"),
    ],
)
def test_the_command_refuses_in_one_line_and_writes_nothing(gpuval, clean, tmp_path, case, fragment):
    docs = documents(clean)
    folder = tmp_path / ("runs\nnew" if case == "a newline in the path" else "runs")
    extra = ["--k", "inf"] if case == "--k inf" else []
    if case == "nodes: 5":
        docs[1]["inventory"]["nodes"] = 5
    elif case == "a true metric":
        docs[1]["measurements"][0]["metrics"]["fp32_tflops"] = True
    elif case == "1e308":
        for doc in docs:
            for measurement in doc["measurements"]:
                measurement["metrics"] = {key: 1e308 for key in measurement["metrics"]}
    elif case == "ranks 0":
        for doc in docs:
            for measurement in doc["measurements"]:
                if "ranks" in measurement["params"]:
                    measurement["params"]["ranks"] = 0
    _write_runs(docs, folder)
    out = tmp_path / "derived.yaml"
    proc = gpuval(["profiles", "derive", str(folder), "--output", str(out), *extra], tmp_path)
    assert_clean((proc.returncode, proc.stdout, proc.stderr), {2}, case, out)
    assert fragment in proc.stderr, proc.stderr


# ---- the manifest: every profile written, or none ----------------------------------------------------------

PROFILE = (
    "name: {name}\nchecks:\n  matmul.fp32_tflops: {{min: 0.001}}\n  train.tokens_per_s_per_gpu: {{min: 1}}\n"
)


def _manifest(tmp_path: Path, clean: list[dict[str, Any]]) -> tuple[Path, Path, Path]:
    """A manifest of two profiles, `one` and `two`, each from its own three clean runs."""
    for name in ("one", "two"):
        (tmp_path / f"{name}.yaml").write_text(PROFILE.format(name=name), encoding="utf-8")
        _write_runs(clean, tmp_path / "results" / name)
    runs = {name: [f"{name}/task-{index}/result.json" for index in range(3)] for name in ("one", "two")}
    profiles = {name: {"profile": f"{name}.yaml", "runs": runs[name]} for name in ("one", "two")}
    manifest = tmp_path / "derivation.yaml"
    manifest.write_text(
        json.dumps({"root": ".", "results": "results", "profiles": profiles}), encoding="utf-8"
    )
    return manifest, tmp_path / "one.yaml", tmp_path / "two.yaml"


def test_a_manifest_whose_second_profile_fails_changes_no_profile(gpuval, clean, tmp_path):
    manifest, one, two = _manifest(tmp_path, clean)
    bad = tmp_path / "results" / "two" / "task-2" / "result.json"
    doc = json.loads(bad.read_text(encoding="utf-8"))
    doc["inventory"]["nodes"] = 5
    bad.write_text(json.dumps(doc), encoding="utf-8")
    before = {path: path.read_bytes() for path in (one, two)}
    proc = gpuval(["profiles", "derive", "--manifest", str(manifest)], tmp_path)
    assert_clean((proc.returncode, proc.stdout, proc.stderr), {2}, "manifest")
    assert "two/task-2/result.json: not a valid gpuval document (inventory.nodes" in proc.stderr, proc.stderr
    assert {path: path.read_bytes() for path in (one, two)} == before


def test_a_manifest_whose_second_profile_cannot_be_written_changes_no_profile(clean, tmp_path, monkeypatch):
    manifest, one, two = _manifest(tmp_path, clean)
    (tmp_path / "second").mkdir()
    moved = tmp_path / "second" / "two.yaml"
    two.rename(moved)
    text = json.loads(manifest.read_text(encoding="utf-8"))
    text["profiles"]["two"]["profile"] = "second/two.yaml"
    manifest.write_text(json.dumps(text), encoding="utf-8")
    before = {path: path.read_bytes() for path in (one, moved)}
    make_temp = tempfile.mkstemp

    def full_disk(*args: Any, **kwargs: Any) -> tuple[int, str]:
        if kwargs.get("dir") == moved.parent:  # root writes anywhere: a full disk there instead
            raise OSError(28, "No space left on device", str(moved.parent))
        return make_temp(*args, **kwargs)

    monkeypatch.setattr(atomic.tempfile, "mkstemp", full_disk)
    monkeypatch.setenv("GPUVAL_HISTORY", "none")
    result = invoke(["profiles", "derive", "--manifest", str(manifest)], tmp_path)
    assert_clean(result, {2}, "manifest")
    assert "No space left on device" in result[2] and "no profile of" in result[2], result[2]
    assert {path: path.read_bytes() for path in (one, moved)} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left
    monkeypatch.setattr(atomic.tempfile, "mkstemp", make_temp)
    assert assert_clean(invoke(["profiles", "derive", "--manifest", str(manifest)], tmp_path), {0}, "") == 0
    assert one.read_bytes() != before[one] and moved.read_bytes() != before[moved]
