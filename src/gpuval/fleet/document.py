"""fleet.json (schema `gpuval.fleet/v1`): the fleet's verdict as a document, and its published JSON Schema.

The shipped schema (gpuval/schema/fleet.v1.json, printed by `gpuval schema fleet`) is the one these models
give (tests/test_fleet_view.py holds them equal).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuval.fleet.hostlist import compress
from gpuval.fleet.judge import MISSING, Summary
from gpuval.fleet.read import FLEET_SCHEMA_ID

Verdict = Literal["PASS", "WARN", "FAIL", "ERROR", "MISSING"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NotPassed(_Strict):
    check: str
    scope: str = Field(description="cluster | node:NAME | gpu:NODE/INDEX | link:NODE/A-B | pair:A+B")
    status: Literal["FAIL", "ERROR", "WARN"]
    value: float | None = None
    bound: dict[str, Any] = Field(default_factory=dict, description="the threshold the run judged it by")
    unit: str = ""
    detail: str = ""


class FleetOutlier(_Strict):
    check: str
    scope: str
    status: Literal["WARN", "FAIL"] = Field(description="FAIL only under --fail-outliers")
    value: float
    unit: str = ""
    fleet_median: float = Field(description="the median of the check's group across the fleet")
    deviation_pct: float | None = Field(description="(value - fleet_median) / |fleet_median|, in %")
    robust_z: float | None = Field(description="modified z-score 0.6745 (value - median) / MAD; null: MAD 0")
    compared_with: str = Field(description="what the median is of: '200 nodes', '1600 GPUs of 200 nodes'")
    detail: str = ""


class FleetNodeEntry(_Strict):
    name: str
    verdict: Verdict
    checks: list[NotPassed] = Field(
        default_factory=list, description="its run's checks that bear on it and did not pass (SKIPs left out)"
    )
    outliers: list[FleetOutlier] = Field(default_factory=list)
    source: str | None = Field(None, description="the result.json counted; null for a MISSING node")
    started_at: str | None = None
    profile: str | None = None
    not_counted: list[str] = Field(default_factory=list, description="older results of the same node")


class Rerun(_Strict):
    error: str = Field(description="ERROR nodes as a Slurm hostlist: their run did not complete")
    missing: str = Field(description="MISSING nodes as a Slurm hostlist: named by --expect, no result")


class OutlierRule(_Strict):
    judged: bool
    z_limit: float
    least_gap_pct: float
    least_nodes: int
    fail: bool = Field(description="--fail-outliers: an outlier FAILs (and drains) its node")
    detail: str


class FleetDocument(_Strict):
    schema_: str = Field(FLEET_SCHEMA_ID, alias="schema")
    created_at: str
    gpuval_version: str = ""
    command: list[str] = Field(default_factory=list)
    files: int = Field(description="result files read")
    counts: dict[str, int] = Field(description="nodes, and nodes per verdict (PASS WARN FAIL ERROR MISSING)")
    drain: str = Field(description="the FAIL nodes as a Slurm hostlist (scontrol update state=drain)")
    rerun: Rerun
    outlier_rule: OutlierRule
    notes: list[str] = Field(default_factory=list)
    nodes: list[FleetNodeEntry] = Field(description="one per node, those that need attention first")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        from gpuval.results import _finite

        return json.dumps(_finite(self.model_dump(mode="json", by_alias=True)), indent=2) + "\n"


def document(summary: Summary, command: list[str]) -> FleetDocument:
    """fleet.json's content for a summary."""
    from gpuval import __version__

    rule = summary.rule
    return FleetDocument(
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        gpuval_version=__version__,
        command=command,
        files=summary.files,
        counts=summary.counts,
        drain=summary.drain,
        rerun=Rerun(error=compress(summary.names("ERROR")), missing=compress(summary.names(MISSING))),
        outlier_rule=OutlierRule(
            judged=any(group.judged for group in summary.groups),
            z_limit=rule.z_limit,
            least_gap_pct=round(rule.least_gap * 100, 6),
            least_nodes=rule.least_nodes,
            fail=rule.fail,
            detail=summary.rule_note,
        ),
        notes=summary.notes,
        nodes=[_entry(node) for node in summary.nodes],
    )


def _entry(node: Any) -> FleetNodeEntry:
    run = node.run
    if run is None:
        return FleetNodeEntry(name=node.name, verdict=node.verdict)
    return FleetNodeEntry(
        name=node.name,
        verdict=node.verdict,
        checks=[
            NotPassed(
                check=c.name,
                scope=c.scope,
                status=c.status.value,
                value=c.value,
                bound=c.threshold,
                unit=c.unit,
                detail=c.detail,
            )
            for c in run.checks
        ],
        outliers=[
            FleetOutlier(
                check=o.reading.check,
                scope=o.reading.scope,
                status=o.status.value,
                value=o.reading.value,
                unit=o.reading.unit,
                fleet_median=o.median,
                deviation_pct=round(o.deviation_pct, 3),
                robust_z=None if o.robust_z is None else round(o.robust_z, 3),
                compared_with=o.peers,
                detail=o.detail,
            )
            for o in node.outliers
        ],
        source=run.source,
        started_at=run.started_text,
        profile=run.profile,
        not_counted=node.older,
    )


def json_schema() -> dict[str, Any]:
    """The published JSON Schema of fleet.json (gpuval/schema/fleet.v1.json)."""
    text = resources.files("gpuval").joinpath("schema/fleet.v1.json").read_text(encoding="utf-8")
    return json.loads(text)


def generated_schema() -> dict[str, Any]:
    """The schema the models give today; the shipped file must equal it."""
    from gpuval.results import _open_mappings_said

    schema = _open_mappings_said(FleetDocument.model_json_schema(by_alias=True))
    schema["$id"] = FLEET_SCHEMA_ID
    schema["title"] = "gpuval fleet"
    return schema
