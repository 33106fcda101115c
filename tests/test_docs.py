"""The README is a front page and the docs are a site (issue 48): the README stays short and every relative
link in it resolves; `mkdocs build --strict` passes (no broken link or anchor, no page outside the nav, no
link to a file the repository lacks: tools/docs_site.py), and the CLI reference it writes from the typer
app names every command there is."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
README_MAX_LINES = 200


def test_the_readme_is_a_front_page_of_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to docs/"


def test_every_relative_link_in_the_readme_resolves_to_a_file_or_folder_of_the_repository():
    text = README.read_text(encoding="utf-8")
    targets = [m.group(1) for m in MD_LINK.finditer(text)]
    relative = [t.split("#", 1)[0] for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    relative = [t for t in relative if t]
    assert len(relative) >= 10, f"the README links to too few docs pages: {relative}"
    missing = [t for t in relative if not ((REPO / t).exists() and (REPO / t).resolve().is_relative_to(REPO))]
    assert not missing, f"README.md links to paths that are not in the repository: {missing}"


class _Loader(yaml.SafeLoader):
    """mkdocs.yml with its `!!python/name:` tags (Material's emoji functions) read as plain strings."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", lambda loader, suffix, node: suffix)


def _nav() -> list:
    return yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)["nav"]


def _pages(entries: list) -> list[str]:
    """Every page of a nav (sections flattened), in order."""
    found = []
    for entry in entries:
        ((_title, target),) = entry.items() if isinstance(entry, dict) else (("", entry),)
        found += _pages(target) if isinstance(target, list) else [target]
    return found


def test_the_readme_links_every_section_of_the_docs_site():
    """The README's "read next" table reaches each section of mkdocs.yml's nav (its first page; the site's
    home is what the README itself is on GitHub)."""
    firsts = [_pages([entry])[0] for entry in _nav()]
    text = README.read_text(encoding="utf-8")
    unlinked = [page for page in firsts if page != "index.md" and f"(docs/{page}" not in text]
    assert not unlinked, f"README.md does not link these sections of the docs site: {unlinked}"


def test_every_page_of_docs_is_in_the_nav_once():
    """mkdocs --strict fails on a page outside the nav; this says which, without mkdocs installed."""
    listed = _pages(_nav())
    assert len(listed) == len(set(listed)), "a page is in mkdocs.yml's nav twice"
    on_disk = sorted(p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md"))
    assert sorted(set(on_disk) - set(listed)) == [], "docs pages missing from mkdocs.yml's nav"
    assert sorted(set(listed) - set(on_disk)) == [], "mkdocs.yml's nav lists pages that do not exist"


def test_the_cli_reference_names_every_command_and_option_of_the_typer_app():
    import typer
    from docs_site import cli_reference

    from gpuval.cli import app

    text = cli_reference()
    root = typer.main.get_command(app)

    def walk(command, path, parent):
        ctx = typer.Context(command, info_name=path[-1], parent=parent)
        assert f"`{' '.join(path)}` {{#{'-'.join(path)}}}" in text, f"no section for {' '.join(path)}"
        for param in command.get_params(ctx):
            if param.name != "help" and not getattr(param, "hidden", False):
                spec = param.get_help_record(ctx)[0]
                assert f"| `{spec}` |" in text, f"{' '.join(path)}: {spec} missing"
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), [*path, name], ctx)

    walk(root, ["gpuval"], None)
    for name in ("collectives", "matmul", "membw", "p2p", "train"):
        assert f"**`{name}`**" in text, f"the benchmark {name} is not in the reference"


def _mkdocs_missing() -> str | None:
    if importlib.util.find_spec("mkdocs") and importlib.util.find_spec("material"):
        return None
    return "mkdocs and mkdocs-material are not installed (pip install -e '.[docs]')"


@pytest.mark.slow
def test_the_site_builds_with_strict_and_no_warning(tmp_path):
    """`mkdocs build --strict` fails on any warning: a broken link or anchor, a page outside the nav, a link
    to a file that is not in the repository. CI sets GPUVAL_REQUIRE_DOCS=1, so there it never skips."""
    missing = _mkdocs_missing()
    if missing:
        if os.environ.get("GPUVAL_REQUIRE_DOCS"):
            pytest.fail(f"GPUVAL_REQUIRE_DOCS is set but {missing}")
        pytest.skip(missing)
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_REPOSITORY", "GITHUB_SERVER_URL")}
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material's notice about its successor, not a warning of this site
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("gpuval-accept", "gpuval-finetune-train", "gpuval-profiles-derive"):
        assert f'id="{command}"' in cli, f"the built CLI reference has no section {command}"
    assert "cli-reference: written by" not in cli, "the CLI reference's marker was not replaced"
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "gpuval accept" in home and 'class="grid cards"' in home
    # links to repository files outside docs/ became their paths (no repo_url here), never dead links
    thresholds = (site / "thresholds" / "index.html").read_text(encoding="utf-8")
    assert "../benchmarks/results/" not in thresholds
