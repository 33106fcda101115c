"""MkDocs hooks of the docs site (mkdocs.yml's `hooks:`), run at every `mkdocs build`:

- the CLI reference: docs/cli.md holds a marker that becomes every `gpuval` command and subcommand, with
  its help, usage line and options as the typer app in src/gpuval/cli defines them now, so the page cannot
  fall behind the code (`python tools/docs_site.py` prints it);
- links to repository files outside docs/ (`../benchmarks/results/...`, `../tools/README.md`): they work
  on GitHub and in a checkout, but a site holds only docs/. With a `repo_url` (mkdocs.yml, or CI's
  `GITHUB_SERVER_URL`/`GITHUB_REPOSITORY`) they become links to the file in the repository; without one
  they become the path as code. A target that is not in the repository is a warning, which
  `mkdocs build --strict` turns into a failure (tests/test_docs.py).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLI_MARKER = "<!-- cli-reference: written by tools/docs_site.py at build time -->"
MD_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
EXTRA = re.compile(r"^(.*?)\s{2}\[([^\[\]]*)\]$", re.S)  # click's "help  [default: x; required]"

log = logging.getLogger("mkdocs.plugins.gpuval")


# --- the CLI reference -----------------------------------------------------------------------------------


def _text(value: str) -> str:
    """Help text as markdown: backquoted spans kept, angle brackets and pipes escaped elsewhere."""
    parts = re.split(r"(`[^`]*`)", value)
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace("|", r"\|").replace("*", r"\*")
    return "".join(parts)


def _cell(value: str) -> str:
    return _text(" ".join(value.split()))


def _extra(pieces: str) -> tuple[str, str]:
    """'default: 3.0; x>=0; required' -> ('3.0', 'required; x>=0'): the default apart, the rest as said."""
    default, rest = "", []
    for piece in (p.strip() for p in pieces.split(";")):
        if piece.startswith("default: "):
            default = piece.removeprefix("default: ")
        elif piece:
            rest.append(piece)
    return default, "; ".join(sorted(rest, key=lambda p: p != "required"))


def _params(command: Any, ctx: Any) -> list[str]:
    """A table of the arguments, then one of the options, each row as `--help` says it."""
    tables: dict[str, list[str]] = {"argument": [], "option": []}
    for param in command.get_params(ctx):
        if param.name == "help" or getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        spec, help_text = record
        default, said = "", ""
        match = EXTRA.match(help_text or "")
        if match:
            help_text = match.group(1)
            default, said = _extra(match.group(2))
        if said:
            help_text = f"{help_text} ({said})" if help_text else said
        kind = "argument" if type(param).__name__.endswith("Argument") else "option"
        shown = f"`{default}`" if default else ""
        tables[kind].append(f"| `{spec}` | {_cell(help_text or '')} | {shown} |")
    out = []
    for kind, rows in tables.items():
        if rows:
            out += [f"| {kind} | what it does | default |", "| --- | --- | --- |", *rows, ""]
    return out


def _commands(command: Any, ctx: Any) -> list[tuple[str, Any]]:
    if not hasattr(command, "list_commands"):
        return []
    found = [(name, command.get_command(ctx, name)) for name in command.list_commands(ctx)]
    return [(name, sub) for name, sub in found if sub is not None and not getattr(sub, "hidden", False)]


def _section(command: Any, path: list[str], parent: Any, out: list[str]) -> None:
    import typer

    ctx = typer.Context(command, info_name=path[-1], parent=parent)
    title = " ".join(path)
    anchor = "-".join(path)
    out += [f"{'#' * min(len(path) + 1, 4)} `{title}` {{#{anchor}}}", ""]
    for paragraph in (command.help or "").strip().split("\n\n"):
        if paragraph.strip():
            out += [_text(" ".join(paragraph.split())), ""]
    usage = command.get_usage(ctx).removeprefix("Usage:").strip()
    out += ["```text", usage, "```", ""]
    out += _params(command, ctx)
    if path == ["gpuval", "bench"]:
        out += _benchmarks()
    subcommands = _commands(command, ctx)
    if subcommands:
        out += ["| command | what it does |", "| --- | --- |"]
        for name, sub in subcommands:
            link = f"#{anchor}-{name}"
            out.append(f"| [`{name}`]({link}) | {_cell(sub.get_short_help_str(limit=300))} |")
        out.append("")
        for name, sub in subcommands:
            _section(sub, [*path, name], ctx, out)


def _value(value: Any) -> str:
    """An option's default as `--set` would take it; a long list as its ends and its length."""
    if value is None:
        return ""
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return f"`{', '.join(value)}`"
    if isinstance(value, list) and len(repr(value)) > 60:
        return f"`{value[0]!r}` … `{value[-1]!r}` ({len(value)} items)"
    return f"`{value}`" if isinstance(value, str) else f"`{value!r}`"


def _fields(model: Any, values: dict[str, Any], on_cpu: dict[str, Any], prefix: str = "") -> list[str]:
    """One row per option `--set` takes (a section's fields dotted: `step.compile`), with both defaults."""
    from pydantic import BaseModel

    rows = []
    for field, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows += _fields(annotation, values[field], on_cpu[field], f"{prefix}{field}.")
        else:
            said = _cell(info.description or "")
            rows.append(f"| `{prefix}{field}` | {said} | {_value(values[field])} | {_value(on_cpu[field])} |")
    return rows


def _benchmarks() -> list[str]:
    """`gpuval bench`'s list: every registered benchmark, its options and their defaults (standard tier)."""
    from gpuval.bench.registry import all_benchmarks

    out = [
        "#### The benchmarks and their options {#gpuval-bench-benchmarks}",
        "",
        "Every benchmark `gpuval bench NAME` runs (`gpuval bench` lists them too). Options are set with "
        "`--set OPTION=VALUE`, or in `gpuval accept` and a profile as `benchmarks.NAME.OPTION`; the "
        "defaults are the standard tier's (`--quick` makes the sweeps smaller).",
        "",
    ]
    for name, item in sorted(all_benchmarks().items()):
        on_gpu = item.make_options({}, False, True, "docs").model_dump()
        on_cpu = item.make_options({}, False, False, "docs").model_dump()
        out += [f"**`{name}`**{{#bench-{name}}}: {_text(item.summary)}", ""]
        out += ["| option | what it does | default on a GPU | on a CPU |", "| --- | --- | --- | --- |"]
        out += [*_fields(item.options, on_gpu, on_cpu), ""]
    return out


def cli_reference() -> str:
    """Every command of the `gpuval` typer app as markdown: help, usage, arguments and options."""
    import typer

    from gpuval.cli import app

    out: list[str] = []
    _section(typer.main.get_command(app), ["gpuval"], None, out)
    return "\n".join(out).rstrip() + "\n"


# --- links to repository files outside docs/ -------------------------------------------------------------


def _repo_url(config: Any) -> str | None:
    url = config.get("repo_url")
    if url:
        return str(url).rstrip("/")
    server, repository = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server.rstrip('/')}/{repository}" if server and repository else None


def _outside(markdown: str, source: Path, docs: Path, repo_url: str | None, branch: str) -> str:
    def replace(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path, _, fragment = target.partition("#")
        resolved = (source.parent / path).resolve()
        if resolved == docs or docs in resolved.parents:
            return match.group(0)  # a page or file of the site: mkdocs checks it
        if REPO not in resolved.parents or not resolved.exists():
            log.warning("%s links to %s, which is not a file of the repository", source.name, target)
            return match.group(0)
        relative = resolved.relative_to(REPO).as_posix()
        if repo_url:
            kind = "tree" if resolved.is_dir() else "blob"
            return f"[{text}]({repo_url}/{kind}/{branch}/{relative}{'#' + fragment if fragment else ''})"
        if text.strip("`").rstrip("/") and relative.endswith(text.strip("`").rstrip("/")):
            return text if text.startswith("`") else f"`{text}`"
        return f"{text} (`{relative}`)"

    pieces, last = [], 0
    for fence in FENCE.finditer(markdown):  # code blocks stay as written
        pieces += [MD_LINK.sub(replace, markdown[last : fence.start()]), fence.group(0)]
        last = fence.end()
    pieces.append(MD_LINK.sub(replace, markdown[last:]))
    return "".join(pieces)


# --- the hooks --------------------------------------------------------------------------------------------


def on_config(config: Any) -> Any:
    """CI's repository (GITHUB_REPOSITORY) as the site's repo_url when mkdocs.yml names none: the header's
    link to the source, and what links to files outside docs/ point at."""
    if not config.get("repo_url"):
        config["repo_url"] = _repo_url(config)
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    docs = Path(config["docs_dir"]).resolve()
    branch = os.environ.get("GPUVAL_DOCS_BRANCH", "main")
    return _outside(markdown, Path(page.file.abs_src_path), docs, _repo_url(config), branch)


if __name__ == "__main__":
    print(cli_reference(), end="")
