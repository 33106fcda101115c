"""The shape of src/gpuval: no import cycle between its modules, no module too long to read, and each
outside library imported only by the layer that owns it (pynvml by gpuval.nvml, rich by report/ and cli/).

A cycle makes import order matter (a name used before its module finished loading) and means two modules
cannot be understood apart; a module past MAX_LINES mixes jobs. A data table (one long literal, read row by
row) is exempt from the limit when it is named in DATA_TABLES and its docstring says it is one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "gpuval"
MAX_LINES = 500
# Modules allowed past MAX_LINES, relative to src/: each must declare itself "a data table" in its docstring.
DATA_TABLES = {"gpuval/finetune/data/catalogue_data.py"}
# The packages that draw for people, the only importers of rich.
UI_PACKAGES = ("gpuval.report", "gpuval.cli")
# The one module that builds scope strings ('gpu:NODE/INDEX', ...) and splits them apart (gpuval.scope.Scope).
SCOPE_MODULE = "gpuval/scope.py"
# issue 36's grep: a scope string written out, or split on its separators
_SCOPE_GREP = re.compile(r'"(gpu|node|link):|f"(gpu|node|link):|split\("[:/]"\)')
# Derived measurements are named only by their own modules (gpuval.derived), never tested for elsewhere.
DERIVED_PACKAGE = "gpuval/derived/"
_DERIVED_NAMES = {"outliers", "correct"}
# a string literal (or an f-string's first piece) that begins a scope of any kind
_SCOPE_LITERAL = re.compile(r"(gpu|node|link|cpu|pair):")
# The one module that builds and reads check names of the families made of other checks (gpuval.checkref).
CHECKREF_MODULE = "gpuval/checkref.py"
_FAMILY_LITERAL = re.compile(r"(drift|soak|fleet)\.(?!(json|html|xml|prom|yaml)\b)")  # not a file's name
# a check name taken apart at its '.' by hand: name.partition("."), names[0].split("."), check.name.split(".")
_NAME_SPLIT = re.compile(
    r'name\w*(\[\d+\])?\.(partition|split|removeprefix)\("\.'  # at its '.'
    r"|removeprefix\(['\"](drift|soak|fleet)\."  # or its family cut off
)


def _module_name(path: Path) -> str:
    """src/gpuval/a/b.py -> gpuval.a.b; a package's __init__.py is the package itself."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((SRC / PACKAGE).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`: imports only a type checker follows."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every dotted name the module imports, at module level and inside functions, outside
    `if TYPE_CHECKING:` blocks; `from X import y` gives both X.y and X (resolved by the caller)."""
    found: list[str] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the `else:` of TYPE_CHECKING runs
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from ..x import y` inside gpuval.a.b -> gpuval.x
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.extend(f"{base}.{alias.name}" if alias.name != "*" else base for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The gpuval module an imported name loads: itself if it is a module, else the nearest enclosing one
    (`from gpuval.x import y` with y a function is gpuval.x); None outside gpuval."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name if name in modules else None


def import_graph() -> dict[str, set[str]]:
    """gpuval module -> the gpuval modules it imports (a module importing itself is left out)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = (
            _resolve(name, modules) for name in _imported_names(tree, module, path.name == "__init__.py")
        )
        graph[module] = {target for target in targets if target is not None and target != module}
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _cycle(graph: dict[str, set[str]], component: list[str], start: str) -> list[str]:
    """The shortest cycle through `start` within its component, as a path that ends where it starts."""
    members = set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:  # breadth first: the shortest way back to the start
        node = queue.pop(0)
        for child in sorted(graph[node] & members):
            if child == start:
                return [*paths[node], start]
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    raise AssertionError(f"no cycle through {start} in {component}")


def _loops(graph: dict[str, set[str]], component: list[str]) -> list[list[str]]:
    """Cycles that together pass through every module of the component: each names a link to cut."""
    loops: list[list[str]] = []
    for module in component:
        if not any(module in loop for loop in loops):
            loops.append(_cycle(graph, component, module))
    return loops


def test_the_graph_sees_function_level_imports_and_skips_type_checking_ones():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import gpuval.a\n"
        "from . import sibling\n"
        "from ..b import thing\n"
        "if TYPE_CHECKING:\n"
        "    import gpuval.typed_only\n"
        "else:\n"
        "    import gpuval.runtime_only\n"
        "def f():\n"
        "    from gpuval.late import name\n"
    )
    names = _imported_names(tree, "gpuval.pkg.mod", is_package=False)
    assert names == [
        "typing.TYPE_CHECKING",
        "gpuval.a",
        "gpuval.pkg.sibling",
        "gpuval.b.thing",
        "gpuval.runtime_only",
        "gpuval.late.name",
    ]
    modules = {"gpuval": Path(), "gpuval.b": Path(), "gpuval.b.thing": Path()}
    assert _resolve("gpuval.b.thing", modules) == "gpuval.b.thing"  # a module: itself
    assert _resolve("gpuval.b.function", modules) == "gpuval.b"  # a name in a module: the module
    assert _resolve("typing.TYPE_CHECKING", modules) is None
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _components(graph) == [["a", "b", "c"]]
    assert _loops(graph, ["a", "b", "c"]) == [["a", "b", "c", "a"]]


def test_no_import_cycle_in_src():
    graph = import_graph()
    assert "gpuval.nvml" in graph and "gpuval.finetune.data.catalogue" in graph["gpuval.finetune.data.synth"]
    cycles = [" -> ".join(loop) for group in _components(graph) for loop in _loops(graph, group)]
    assert not cycles, "import cycles (imports inside functions count):\n  " + "\n  ".join(cycles)


def _importers(library: str) -> list[str]:
    """The gpuval modules that import `library` or one of its modules (inside functions too)."""
    importers = []
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = _imported_names(tree, module, path.name == "__init__.py")
        if any(name == library or name.startswith(library + ".") for name in names):
            importers.append(module)
    return importers


def test_only_the_nvml_layer_imports_pynvml():
    """Every NVML call goes through gpuval.nvml, whose queries never raise: a module importing pynvml
    itself would bring NVML's exceptions back."""
    assert _importers("pynvml") == ["gpuval.nvml"]


def _in_ui_layer(module: str) -> bool:
    return any(module == package or module.startswith(package + ".") for package in UI_PACKAGES)


def test_only_the_report_and_cli_layers_import_rich():
    """Rendering for people lives in gpuval.report and gpuval.cli; every other module returns data (the
    way nvitop's api/ knows nothing of its UI), so it can be used, and tested, without a terminal."""
    importers = _importers("rich")
    assert "gpuval.report.console" in importers and "gpuval.cli.options" in importers  # the test sees them
    outside = [module for module in importers if not _in_ui_layer(module)]
    assert not outside, "rich imported outside report/ and cli/ (return data, draw it there):\n  " + (
        "\n  ".join(outside)
    )


def test_the_ui_layer_check_tells_a_package_from_a_name_that_starts_alike():
    assert _in_ui_layer("gpuval.report") and _in_ui_layer("gpuval.cli.monitor")
    assert not _in_ui_layer("gpuval.reporting") and not _in_ui_layer("gpuval.monitor")


# gpuval.finetune's subpackages (issue 52) and the gpuval.finetune modules each may import: imports go one
# way, from the loop at the top down to the base (config, model, template). A subpackage's own modules and
# anything outside gpuval.finetune are always allowed.
FINETUNE_BASE = ("config", "model", "template", "flops", "optim", "lock", "parts")
FINETUNE_SUBPACKAGES = {
    "gpuval.finetune.data": FINETUNE_BASE,
    "gpuval.finetune.parallel": FINETUNE_BASE,
    "gpuval.finetune.step": (*FINETUNE_BASE, "parallel"),
    "gpuval.finetune.eval": (*FINETUNE_BASE, "data"),
    "gpuval.finetune.export": (*FINETUNE_BASE, "checkpoint"),
}


def test_the_finetune_tests_follow_its_subpackages():
    """tests/finetune/ mirrors src/gpuval/finetune/: each folder of tests is a subpackage's, and every
    subpackage with tests of its own has its folder."""
    tests = Path(__file__).parent / "finetune"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    subpackages = {name.rsplit(".", 1)[1] for name in FINETUNE_SUBPACKAGES}
    assert folders <= subpackages, folders - subpackages
    stray = list(Path(__file__).parent.glob("test_finetune_*.py"))
    assert not stray, f"fine-tune tests belong in tests/finetune/: {stray}"


def _finetune_imports_going_up(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for package, allowed in FINETUNE_SUBPACKAGES.items():
        may = {package, *(f"gpuval.finetune.{name}" for name in allowed)}
        for module, imported in graph.items():
            if module != package and not module.startswith(package + "."):
                continue
            for target in sorted(imported):
                inside = target.startswith("gpuval.finetune.") or target == "gpuval.finetune"
                if inside and not any(target == m or target.startswith(m + ".") for m in may):
                    found.append(f"{module} imports {target}")
    return found


def test_finetune_subpackages_import_only_downward():
    """finetune/eval/ (and the subpackages after it) import the base and the layers below them, never the
    step, the parallel modes or the loop: a newcomer reads a subpackage without the rest."""
    found = _finetune_imports_going_up(import_graph())
    assert not found, "finetune subpackages importing upward:\n  " + "\n  ".join(found)
    assert _finetune_imports_going_up({"gpuval.finetune.eval.scoring": {"gpuval.finetune.trainer"}})


def test_no_module_over_the_line_limit_except_declared_data_tables():
    too_long = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES and relative not in DATA_TABLES:
            too_long.append(f"{relative}: {lines} lines")
    assert not too_long, f"modules over {MAX_LINES} lines (split them by job):\n  " + "\n  ".join(too_long)


def test_every_declared_data_table_exists_and_says_it_is_one():
    for relative in sorted(DATA_TABLES):
        path = SRC / relative
        assert path.is_file(), f"DATA_TABLES names {relative}, which is not there"
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        assert "a data table" in docstring.lower(), f"{relative}'s docstring does not declare a data table"


def _scope_literals(tree: ast.AST, pattern: re.Pattern[str] = _SCOPE_LITERAL) -> list[int]:
    """Lines of string literals, docstrings aside, that begin a scope: 'gpu:', f"node:{name}", 'pair:'
    (or whatever `pattern` matches at their start)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and pattern.match(node.value)
    )


def test_scope_strings_are_built_and_split_only_in_the_scope_module():
    """A scope is built with gpuval.scope.Scope and read back with Scope.parse (or its lenient readers):
    a module writing 'gpu:{node}/{index}' itself, or splitting a scope on ':' and '/', would let the stored
    shape drift apart from the one every reader expects."""
    found = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative == SCOPE_MODULE:
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        found += [
            f"{relative}:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if _SCOPE_GREP.search(line)
        ]
        found += [f"{relative}:{n}: {lines[n - 1].strip()}" for n in _scope_literals(ast.parse(text))]
    assert not found, "scope strings built or split outside gpuval/scope.py (use Scope):\n  " + "\n  ".join(
        sorted(set(found))
    )


def test_derived_check_names_are_built_and_read_only_in_checkref():
    """'drift.<check>', 'soak.<check>', 'fleet.<label>' are built with gpuval.checkref.in_family and read
    with member_of and family_of: a module writing f"drift.{name}" or splitting a name at its '.' itself
    would let the names apart from what their readers (history, arrivals, the fleet view) expect."""
    found = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative == CHECKREF_MODULE:
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        found += [
            f"{relative}:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if _NAME_SPLIT.search(line)
        ]
        literals = _scope_literals(ast.parse(text), _FAMILY_LITERAL)
        found += [f"{relative}:{n}: {lines[n - 1].strip()}" for n in literals]
    assert not found, (
        "check names built or split outside gpuval/checkref.py (use in_family, member_of, family_of):\n  "
        + "\n  ".join(sorted(set(found)))
    )


def test_the_check_name_rule_sees_builders_and_splitters():
    tree = ast.parse(
        'x = f"drift.{name}"\ny = c.name.startswith("soak.")\nz = "fleet.driver"\nw = "driftless"\n'
    )
    assert _scope_literals(tree, _FAMILY_LITERAL) == [1, 2, 3]
    assert _NAME_SPLIT.search('target, _, rest = name.partition(".")')
    assert _NAME_SPLIT.search('family = names[0].split(".")[0]')
    assert _NAME_SPLIT.search('check.name.split(".", 1)')
    assert _NAME_SPLIT.search("plain = name.removeprefix('soak.')")
    assert not _NAME_SPLIT.search('parts = key.strip().split(".")')
    assert not _scope_literals(ast.parse('FILES = ("fleet.json", "fleet.html")'), _FAMILY_LITERAL)


def test_derived_measurements_are_named_only_in_their_own_modules():
    """'outliers' and 'correct' are declared, computed and explained in gpuval/derived/: code elsewhere asks
    its registry (gpuval.derived.get) what a measurement is instead of testing for a name."""
    found = []
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith(DERIVED_PACKAGE):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in _DERIVED_NAMES:
                found.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert not found, "derived measurements named outside gpuval/derived/:\n  " + "\n  ".join(found)


def test_the_scope_rule_sees_builders_and_splitters():
    tree = ast.parse('"""gpu:n1/0 in a docstring"""\nx = f"gpu:{node}/{i}"\ny = "pair:" + a\nz = "cluster"\n')
    assert _scope_literals(tree) == [2, 3]
    assert _SCOPE_GREP.search('scope.split(":", 1)[1].split("/")[0]')
    assert _SCOPE_GREP.search('scope=f"node:{name}"')
    assert not _SCOPE_GREP.search('version.split("+")')
