"""JUnit XML: one testcase per check, so CI systems (Jenkins, GitLab, GitHub) list every check."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from gpuval.atomic import write_text_atomic
from gpuval.results import Result, Status


def junit_xml(result: Result) -> str:
    counts = {status: sum(1 for c in result.checks if c.status is status) for status in Status}
    suite = ET.Element(
        "testsuite",
        {
            "name": f"gpuval.{result.profile}",
            "tests": str(len(result.checks)),
            "failures": str(counts[Status.FAIL]),
            "errors": str(counts[Status.ERROR]),
            "skipped": str(counts[Status.SKIP]),
            "time": f"{result.duration_s:.3f}",
            "timestamp": result.started_at,
        },
    )
    for check in result.checks:
        case = ET.SubElement(suite, "testcase", {"classname": check.scope, "name": check.name})
        if check.threshold.get(
            "source"
        ):  # what stands behind the bound (Jenkins' and GitLab's testcase properties)
            properties = ET.SubElement(case, "properties")
            for name in ("evidence", "source"):
                ET.SubElement(
                    properties, "property", {"name": f"bound.{name}", "value": str(check.threshold[name])}
                )
        value = "" if check.value is None else f"{check.value:.6g} {check.unit}".strip()
        message = check.detail or value
        if check.status is Status.FAIL:
            ET.SubElement(
                case, "failure", {"message": message, "type": "threshold"}
            ).text = f"value {value}, threshold {check.threshold}"
        elif check.status is Status.ERROR:
            ET.SubElement(case, "error", {"message": message, "type": "error"})
        elif check.status is Status.SKIP:
            ET.SubElement(case, "skipped", {"message": message})
        else:
            ET.SubElement(case, "system-out").text = f"{check.status.value}: {message}"
    suites = ET.Element("testsuites", {"name": "gpuval", "tests": str(len(result.checks))})
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(result: Result, path: Path) -> None:
    write_text_atomic(path, junit_xml(result))
