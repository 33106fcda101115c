"""Every file of `gpuval fleet --output DIR`, each replaced atomically (temp file and rename): a reader of the
folder never sees half a file, and a refused input (found before this runs) leaves the folder as it was."""

from __future__ import annotations

from pathlib import Path

from gpuval.atomic import ensure_writable_dir, write_text_atomic
from gpuval.fleet.document import document
from gpuval.fleet.html import render_html
from gpuval.fleet.judge import Summary
from gpuval.fleet.junit import junit_xml

FILES = ("fleet.json", "fleet.html", "junit.xml")


def write_fleet(summary: Summary, output: Path, command: list[str]) -> list[Path]:
    """fleet.json, fleet.html and junit.xml in `output`; every text is made before the first is written."""
    texts = (document(summary, command).to_json(), render_html(summary), junit_xml(summary))
    ensure_writable_dir(output)
    return [write_text_atomic(output / name, text) for name, text in zip(FILES, texts, strict=True)]
