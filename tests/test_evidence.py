"""Evidence apart from tools: every results folder is named, documented and indexed (current, or under
archive/ with what superseded it), and every repository path and relative link the markdown writes exists.
Facts the code relies on are cited from docs/, never from a file outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
ARCHIVE = RESULTS / "archive"  # superseded folders, whole and under their names
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
    REPO / "benchmarks" / "NOTES.md",
    REPO / "tools" / "README.md",
    INDEX,
    *sorted((REPO / "docs").glob("*.md")),
]


def _folders() -> list[str]:
    """The current results folders (archive/ is not one)."""
    return sorted(p.name for p in RESULTS.iterdir() if p.is_dir() and p != ARCHIVE)


def _archived() -> list[str]:
    return sorted(p.name for p in ARCHIVE.iterdir() if p.is_dir()) if ARCHIVE.is_dir() else []


def _section(title: str) -> str:
    text = INDEX.read_text(encoding="utf-8")
    assert f"\n## {title}\n" in text, f"INDEX.md has no '## {title}' section"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _rows(title: str) -> list[list[str]]:
    """The cells of each body row of the table in INDEX.md's section `title`."""
    lines = [line for line in _section(title).splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def _index_folders() -> list[str]:
    """The first cell of each row of INDEX.md's "Folders" table."""
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", _section("Folders"), re.M)]


def _index_archived() -> list[str]:
    """The first cell of each row of INDEX.md's "Archive" table, written `archive/NAME`."""
    return [m.group(1) for m in re.finditer(r"^\| `archive/([^`]+)` \|", _section("Archive"), re.M)]


def test_every_results_folder_is_named_by_date_machine_and_topic_and_has_a_readme():
    folders = _folders() + _archived()
    assert _folders(), "no results folders"
    misnamed = [name for name in folders if not FOLDER.match(name)]
    assert not misnamed, f"not YYYY-MM-DD-<machine>-<topic>: {misnamed}"
    without = [
        name
        for name in folders
        if not (RESULTS / name / "README.md").is_file() and not (ARCHIVE / name / "README.md").is_file()
    ]
    assert not without, f"results folders without a README.md: {without}"
    stray = [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "INDEX.md"]
    stray += [f"archive/{p.name}" for p in ARCHIVE.iterdir() if not p.is_dir()] if ARCHIVE.is_dir() else []
    assert not stray, f"files outside a results folder: {stray}"
    both = sorted(set(_folders()) & set(_archived()))
    assert not both, f"folders both current and archived: {both}"


def test_the_index_lists_every_results_folder_once_and_no_other():
    for listed, folders, where in (
        (_index_folders(), set(_folders()), "Folders"),
        (_index_archived(), set(_archived()), "Archive"),
    ):
        assert len(listed) == len(set(listed)), f"a folder is listed twice in INDEX.md's {where}"
        assert sorted(folders - set(listed)) == [], f"results folders missing from INDEX.md's {where}"
        assert sorted(set(listed) - folders) == [], f"INDEX.md's {where} lists folders that do not exist"


def test_a_current_folder_says_what_it_is_current_for_and_an_archived_one_what_superseded_it():
    superseded = [row[0] for row in _rows("Folders") if not row[-1].startswith("current")]
    assert not superseded, (
        f"INDEX.md: folders not current: move them under archive/ with git mv: {superseded}"
    )
    known = set(_folders()) | {f"archive/{name}" for name in _archived()}
    for row in _rows("Archive"):
        named = re.findall(r"`((?:archive/)?" + _NAME + r")`", row[-1])
        assert named, f"INDEX.md's Archive: {row[0]} names no folder that superseded it"
        assert set(named) <= known, (
            f"INDEX.md's Archive: {row[0]} is superseded by a folder not there: {named}"
        )


def test_the_current_view_names_current_folders_and_every_archived_one_under_its_topic():
    rows = _rows("Current, by topic")
    assert rows, "INDEX.md's current view is empty"
    current, archived = set(_folders()), set(_archived())
    shown: list[str] = []
    for topic, _machine, now, replaced in rows:
        named = FOLDER_IN_TEXT.findall(now)
        assert named, f"INDEX.md's current view: '{topic}' names no current folder"
        wrong = [name for name in named if name not in current]
        assert not wrong, f"INDEX.md's current view: '{topic}' calls these current: {wrong}"
        shown += re.findall(r"archive/(" + _NAME + ")", replaced)
    assert sorted(archived - set(shown)) == [], "archived folders under no topic of INDEX.md's current view"
    assert sorted(set(shown) - archived) == [], "INDEX.md's current view archives folders not in archive/"


def test_every_results_folder_the_documents_name_exists_where_they_say():
    folders, archived = set(_folders()), set(_archived())
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        named = set(FOLDER_IN_TEXT.findall(text))
        missing = sorted(named - folders - archived)
        assert not missing, f"{document.relative_to(REPO)} names results folders that do not exist: {missing}"
        bare = sorted(
            {
                m.group(0)
                for m in FOLDER_IN_TEXT.finditer(text)
                if m.group(0) in archived and text[max(0, m.start() - 8) : m.start()] != "archive/"
            }
        )
        assert not bare, f"{document.relative_to(REPO)} names archived folders without archive/: {bare}"
        unmoved = [m.group(1) for m in re.finditer(r"archive/(" + _NAME + r")(?![\w-])", text)]
        assert set(unmoved) <= archived, (
            f"{document.relative_to(REPO)}: not in archive/: {set(unmoved) - archived}"
        )


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


def _markdown_files() -> list[Path]:
    """Every markdown file of the repository (git's list, else a walk), the results' READMEs included."""
    try:
        command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.md"]
        listed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout
        files = [REPO / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "node_modules", "gpuval-results"}
        files = [p for p in REPO.rglob("*.md") if not skip & set(p.relative_to(REPO).parts)]
    return sorted(p for p in files if p.is_file())


# a path relative to the document that prose writes: `../FOLDER/file.json`, `../../docs/x.md`
RELATIVE_PATH = re.compile(r"(?<![\w/.-])(?:\.\./)+[\w.*-]+(?:/[\w.*-]+)*/?")
PLACEHOLDER = re.compile(r"^[a-z]+N$")  # `runN`: any of run1, run2, ...


def _resolves(base: Path, target: str) -> bool:
    target = target.rstrip(".,:;")
    if any(c in target for c in "*?["):
        return any(base.glob(target))
    path = base / target
    if not path.exists() and PLACEHOLDER.match(path.name):
        return path.parent.is_dir()
    return path.exists()


def test_every_relative_link_and_path_in_the_markdown_resolves():
    """Markdown links and the `../` paths prose writes (results READMEs point at each other that way), in
    every markdown file: moving a folder under archive/ must rewrite them."""
    broken = []
    for document in _markdown_files():
        text = document.read_text(encoding="utf-8")
        where = document.relative_to(REPO)
        for match in MD_LINK.finditer(text):
            target = match.group(1).split("#", 1)[0]
            if target and not re.match(r"^[a-z]+:", target) and not (document.parent / target).exists():
                broken.append(f"{where}: ({target})")
        for match in RELATIVE_PATH.finditer(text):
            if not _resolves(document.parent, match.group(0)):
                broken.append(f"{where}: {match.group(0)}")
    assert not broken, "relative links that do not resolve:\n" + "\n".join(broken)


def _derivation_paths() -> list[str]:
    """Every results path the manifest lists and every run a shipped profile's bound names in its source."""
    import yaml

    manifest = yaml.safe_load((REPO / "benchmarks" / "derivation.yaml").read_text(encoding="utf-8"))
    paths = [
        run if isinstance(run, str) else run["path"]
        for p in manifest["profiles"].values()
        for run in p["runs"]
    ]
    for profile in sorted((REPO / "src" / "gpuval" / "profiles").glob("*.yaml")):
        text = " ".join(profile.read_text(encoding="utf-8").split())  # a folded source's runs on one line
        paths += re.findall(r"(?<![\w/-])(" + _NAME + r"/[\w./-]+\.json)", text)
    return sorted(set(paths))


def test_the_runs_shipped_bounds_come_from_are_current_and_readable():
    """A folder a shipped bound is derived from is current by definition: never archived, and every file
    the manifest and the profiles' sources name is there for `gpuval profiles derive --check`."""
    paths = _derivation_paths()
    assert len(paths) > 20, f"too few runs found in derivation.yaml and the profiles: {paths}"
    missing = [path for path in paths if not (RESULTS / path).is_file()]
    assert not missing, f"runs named by derivation.yaml or a profile's source that do not exist: {missing}"
    archived = sorted({path.split("/", 1)[0] for path in paths} & set(_archived()))
    assert not archived, f"sources of shipped bounds moved to archive/ (they are current): {archived}"


def test_benchmarks_holds_only_the_benchmarks_its_readme_lists_and_research_scripts_are_in_tools():
    """benchmarks/ keeps the speed and goal benchmarks of its README's table; one-off research scripts live
    in tools/research/ with a line each in tools/README.md."""
    listed = set(
        re.findall(r"^\| `([\w.-]+\.(?:py|sh))` \|", (REPO / "benchmarks" / "README.md").read_text(), re.M)
    )
    scripts = {p.name for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".sh")}
    assert sorted(scripts - listed) == [], (
        "scripts in benchmarks/ its README's table does not list (research: tools/research/)"
    )
    tools_readme = (REPO / "tools" / "README.md").read_text(encoding="utf-8")
    research = (tools_readme.split("## `research/`", 1) + [""])[1]
    unlisted = [
        p.name
        for p in sorted((REPO / "tools" / "research").glob("*.py"))
        if f"| `{p.name}` |" not in research
    ]
    assert not unlisted, (
        f"tools/research/ scripts without a line in tools/README.md's research table: {unlisted}"
    )


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
