"""Measurements, checks, the verdict, result.json (schema `gpuval.result/v1`) and the document of
`gpuval bench --output` (schema `gpuval.bench/v1`).

A Measurement is what a benchmark observed; a Check is a measurement held against a threshold. The
verdict is computed from checks alone, so a result file can always be re-judged from its contents.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from gpuval.atomic import write_text_atomic

SCHEMA_ID = "gpuval.result/v1"
BENCH_SCHEMA_ID = "gpuval.bench/v1"
# the documents whose JSON Schema is shipped in gpuval/schema/ (`gpuval schema DOCUMENT` prints it)
Document = Literal["result", "bench"]


class Status(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    WARN = "WARN"
    SKIP = "SKIP"
    ERROR = "ERROR"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _not_text_or_boolean(value: Any) -> Any:
    """A metric's value as gpuval writes it, a number or null: JSON's `true` would read as 1.0 and "5" as
    5.0 in pydantic's lax mode. Non-finite values stay legal here: a measurement made in memory may hold
    NaN, which `to_json` writes as null (and JSON files cannot hold: gpuval.inputs refuses them). Stricter
    than a profile's numbers (config.Number), which take text that reads as a number: YAML 1.1 leaves
    '1e-3' as text, while a metric gpuval wrote is always a JSON number."""
    if isinstance(value, (bool, str)):
        shown = json.dumps(value)[:40]
        raise PydanticCustomError(
            "number_type", f"{shown} is not a number: a metric's value is a number, or null"
        )
    return value


_MetricValue = Annotated[float | None, BeforeValidator(_not_text_or_boolean)]


class Measurement(_Strict):
    name: str = Field(description="benchmark item, e.g. 'all_reduce' or 'matmul'")
    scope: str = Field(description="cluster | node:NAME | gpu:NODE/INDEX | link:NODE/A-B")  # gpuval.scope
    params: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, _MetricValue] = Field(default_factory=dict, description="unit in each key: busbw_gbps")
    samples: int = Field(0, description="timed repetitions behind the metrics")


class Check(_Strict):
    name: str = Field(description="'<measurement>.<metric>' or a named health check")
    status: Status
    value: float | None = None
    threshold: dict[str, Any] = Field(default_factory=dict)
    unit: str = ""
    scope: str = "cluster"
    detail: str = Field("", description="one line a person can act on")


class World(_Strict):
    size: int = 1
    nodes: int = 1
    backend: str = "gloo"


class Result(_Strict):
    schema_: str = Field(SCHEMA_ID, alias="schema")
    verdict: Status
    started_at: str
    duration_s: float
    profile: str
    world: World
    inventory: dict[str, Any] = Field(default_factory=dict)
    measurements: list[Measurement] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list)
    gpuval_version: str = ""
    command: list[str] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict, description="effective profile after --set")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return json.dumps(_finite(self.model_dump(mode="json", by_alias=True)), indent=2) + "\n"

    def write(self, path) -> None:
        write_text_atomic(path, self.to_json())


class BenchInventory(_Strict):
    nodes: list[dict[str, Any]] = Field(
        default_factory=list, description="gpuval discover's inventory of every node that ran ranks"
    )


class BenchDocument(_Strict):
    """What `gpuval bench NAME --output FILE` writes: one benchmark's measurements and what ran them.

    Its fields and their order are the ones the untyped document of earlier versions had, so files
    written then still validate."""

    schema_: str = Field(BENCH_SCHEMA_ID, alias="schema")
    benchmark: str
    started_at: str
    duration_s: float
    world: World
    status: Literal["OK", "SKIP", "ERROR"] = Field(
        "OK", description="OK: it ran; SKIP or ERROR: it did not, `detail` says why"
    )
    detail: str = ""
    options: dict[str, Any] = Field(default_factory=dict, description="the benchmark's effective options")
    command: list[str] = Field(default_factory=list)
    inventory: BenchInventory = Field(default_factory=BenchInventory)
    measurements: list[Measurement] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return json.dumps(_finite(self.model_dump(mode="json", by_alias=True)), indent=2) + "\n"


# A result.json is read up to this size: one accept over 1,000 nodes of 8 GPUs writes ~164 MiB (its
# matmul sweep kept, ~2x that; benchmarks/report_scale.py), which json and pydantic hold in ~2 GiB of memory
MAX_RESULT_BYTES = 512 * 2**20


def load_result(path: Path) -> Result:
    """A result.json read back; anything else is a one-line UsageError naming the file and the fault."""
    from pydantic import ValidationError

    from gpuval.errors import UsageError
    from gpuval.inputs import collector_paused, load_json

    with collector_paused():  # millions of objects for a large fleet's result: gpuval.inputs says why
        data = load_json(path, "result file", MAX_RESULT_BYTES)
        found = data.get("schema") if isinstance(data, dict) else None
        if found != SCHEMA_ID:
            shown = "none" if found is None else repr(found)[:60]
            raise UsageError(
                f"{path} is not a gpuval result.json (schema: {shown}, expected {SCHEMA_ID}): pass the "
                "result.json that gpuval accept or health wrote"
            )
        try:
            return Result.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ())) or "the document"
            raise UsageError(
                f"{path} is not a gpuval result.json ({where}: {first.get('msg', 'invalid')}): pass the "
                "result.json that gpuval accept or health wrote"
            ) from None


def verdict(checks: list[Check]) -> Status:
    """FAIL if the hardware failed any check; else ERROR if any check could not be completed; else PASS.

    A proven hardware fault outranks an incomplete run: the node must be fixed either way. WARN and SKIP
    never change a PASS. No checks at all, or only skipped ones, is ERROR: nothing was shown to work.
    """
    statuses = {check.status for check in checks}
    if Status.FAIL in statuses:
        return Status.FAIL
    if Status.ERROR in statuses or not statuses - {Status.SKIP}:
        return Status.ERROR
    return Status.PASS


def _finite(value: Any) -> Any:
    """JSON has no NaN/Infinity: store them as null so every JSON parser reads the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def json_schema(document: Document = "result") -> dict[str, Any]:
    """The published JSON Schema of result.json, or of the bench document (gpuval/schema/*.v1.json)."""
    text = resources.files("gpuval").joinpath(f"schema/{document}.v1.json").read_text(encoding="utf-8")
    return json.loads(text)


def generated_schema(document: Document = "result") -> dict[str, Any]:
    """The schema the models give today; the shipped file must equal it (tests/test_results.py)."""
    model, schema_id, title = {
        "result": (Result, SCHEMA_ID, "gpuval result"),
        "bench": (BenchDocument, BENCH_SCHEMA_ID, "gpuval bench"),
    }[document]
    schema = _open_mappings_said(model.model_json_schema(by_alias=True))
    schema["$id"] = schema_id
    schema["title"] = title
    return schema


def _open_mappings_said(node: Any) -> Any:
    """Every free-form mapping (`dict[str, Any]`: an object with no properties) says
    `additionalProperties: true`, as newer pydantic releases write it; 2.6, the lowest gpuval supports,
    leaves it implicit, which JSON Schema reads the same. Said always, the schema is one text on both."""
    if isinstance(node, dict):
        node = {key: _open_mappings_said(value) for key, value in node.items()}
        if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
            node["additionalProperties"] = True
    elif isinstance(node, list):
        node = [_open_mappings_said(value) for value in node]
    return node
