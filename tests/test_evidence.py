"""Evidence apart from tools: every results folder is named, documented and indexed, and every repository
path the README, docs/ and the indexes write exists. Facts the code relies on are cited from docs/, never
from a file outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
INDEX = RESULTS / "INDEX.md"

# YYYY-MM-DD-<machine>-<topic>: cpu, or a GPU kind and count (h100x1, h200x4); the topic in lower-case words
_NAME = r"\d{4}-\d{2}-\d{2}-(?:cpu|[a-z][a-z0-9]*x\d+)-[a-z0-9]+(?:-[a-z0-9]+)*"
FOLDER = re.compile(f"^{_NAME}$")
FOLDER_IN_TEXT = re.compile(r"(?<![\w-])" + _NAME)
# Repository paths as prose writes them: `benchmarks/...`, `tools/...`, `docs/...` and the like.
TOP_DIRS = ("benchmarks", "tools", "docs", "configs", "deploy", "src", "tests", ".ci")
REPO_PATH = re.compile(r"(?<![\w/.$-])(?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w./*-]*")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCUMENTS = [
    REPO / "README.md",
    REPO / "benchmarks" / "README.md",
    REPO / "tools" / "README.md",
    INDEX,
    *sorted((REPO / "docs").glob("*.md")),
]


def _folders() -> list[str]:
    return sorted(p.name for p in RESULTS.iterdir() if p.is_dir())


def _index_folders() -> list[str]:
    """The first cell of each row of INDEX.md's "Folders" table."""
    text = INDEX.read_text(encoding="utf-8")
    section = text.split("\n## Folders", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", section, re.M)]


def test_every_results_folder_is_named_by_date_machine_and_topic_and_has_a_readme():
    folders = _folders()
    assert folders, "no results folders"
    misnamed = [name for name in folders if not FOLDER.match(name)]
    assert not misnamed, f"not YYYY-MM-DD-<machine>-<topic>: {misnamed}"
    without = [name for name in folders if not (RESULTS / name / "README.md").is_file()]
    assert not without, f"results folders without a README.md: {without}"
    stray = [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "INDEX.md"]
    assert not stray, f"files outside a results folder: {stray}"


def test_the_index_lists_every_results_folder_once_and_no_other():
    listed = _index_folders()
    folders = set(_folders())
    assert len(listed) == len(set(listed)), "a folder is listed twice in INDEX.md"
    assert sorted(folders - set(listed)) == [], "results folders missing from INDEX.md"
    assert sorted(set(listed) - folders) == [], "INDEX.md lists folders that do not exist"


def test_every_results_folder_the_documents_name_exists():
    folders = set(_folders())
    for document in DOCUMENTS:
        named = set(FOLDER_IN_TEXT.findall(document.read_text(encoding="utf-8")))
        missing = sorted(named - folders)
        assert not missing, f"{document.relative_to(REPO)} names results folders that do not exist: {missing}"


def _exists(path: str) -> bool:
    if any(c in path for c in "*?["):
        return any(REPO.glob(path))
    return (REPO / path).exists()


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_document_writes_exists(document):
    text = document.read_text(encoding="utf-8")
    missing = []
    for match in REPO_PATH.finditer(text):
        path = match.group(0).split("::", 1)[0].rstrip(".,:;")
        if text[match.end() : match.end() + 1] in "<{":  # a placeholder follows: `results/<date>-…`
            continue
        if path.endswith("…") or not _exists(path):
            missing.append(path)
    for match in MD_LINK.finditer(text):
        target = match.group(1).split("#", 1)[0]
        if not target or re.match(r"^[a-z]+:", target):
            continue
        if not (document.parent / target).exists():
            missing.append(target)
    assert not missing, f"{document.relative_to(REPO)} writes paths that do not exist: {sorted(set(missing))}"


def _tracked_text_files() -> list[Path]:
    try:
        command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        listed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout
        files = [REPO / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but the usual noise
        skip = {".git", ".venv", "__pycache__", ".ruff_cache", ".pytest_cache", "gpuval-results"}
        files = [p for p in REPO.rglob("*") if p.is_file() and not skip & set(p.relative_to(REPO).parts)]
    out = []
    for path in files:
        relative = path.relative_to(REPO)
        # the evidence's own files (logs, JSON) are kept as they were written; their READMEs are checked
        if relative.parts[:2] == ("benchmarks", "results") and path.suffix != ".md":
            continue
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            out.append((path, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue  # binary
    return out


OUTSIDE_SOURCES = re.compile(r"REFERENCE\.md|(?<![\w/.-])(?:\.\./)*shared/|/work/shared\b")


def test_no_tracked_file_cites_a_file_outside_the_repository():
    """Facts the code cites live in docs/ with their public sources, not in a file only one machine has."""
    offenders = [
        f"{path.relative_to(REPO)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}"
        for path, text in _tracked_text_files()
        for m in OUTSIDE_SOURCES.finditer(text)
    ]
    assert not offenders, "cites a file outside the repository (use docs/):\n" + "\n".join(offenders)
