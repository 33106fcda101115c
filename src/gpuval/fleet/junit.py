"""The fleet's junit.xml: one testcase per node, so a CI system lists every node (as gpuval.report.junit lists
every check of one run): a failure for FAIL, an error for ERROR and MISSING, the reasons in the message."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from gpuval.fleet.judge import MISSING, Summary


def junit_xml(summary: Summary) -> str:
    counts = summary.counts
    suite = ET.Element(
        "testsuite",
        {
            "name": "gpuval.fleet",
            "tests": str(counts["nodes"]),
            "failures": str(counts["FAIL"]),
            "errors": str(counts["ERROR"] + counts[MISSING]),
            "skipped": "0",
        },
    )
    for node in summary.nodes:
        case = ET.SubElement(suite, "testcase", {"classname": "node", "name": node.name})
        why = node.reasons()
        message = why[0] if why else node.verdict
        if node.verdict == "FAIL":
            ET.SubElement(case, "failure", {"message": message, "type": "FAIL"}).text = "\n".join(why)
        elif node.verdict in ("ERROR", MISSING):
            ET.SubElement(case, "error", {"message": message, "type": node.verdict}).text = "\n".join(why)
        else:
            ET.SubElement(case, "system-out").text = "\n".join([node.verdict, *why])
    suites = ET.Element("testsuites", {"name": "gpuval", "tests": str(counts["nodes"])})
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
