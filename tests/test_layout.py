"""The house stays as built: the folders are the stages, imports point one way, no circles,
CNI knowledge in the CNI packages, no file too long, and the README's map matches the tree.

Imports are read with ``ast`` from every module of traceflow/, collectors/ and renderers/:
module-level and function-level ones alike (a lazy import is still a dependency), ``from x
import y`` counting as an import of ``x.y`` when that is a module. Each module has a stage,
from its folder; the stages, bottom to top, and what each may import:

    model < engines < bundle < walk < cni < questions < renderers < collectors < cli
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("traceflow", "collectors", "renderers")
MAX_LINES = 800
# files allowed past MAX_LINES, each with the reason (none today)
LONG_FILES: dict[str, str] = {}

STAGES = ("model", "engines", "bundle", "walk", "cni", "questions", "renderers", "collectors",
          "cli")
# what a stage may import besides itself; anything not listed points up (or sideways)
MAY_IMPORT = {
    "model": set(),
    "engines": {"model"},
    "bundle": {"model", "engines"},
    "walk": {"model", "engines", "bundle"},
    "cni": {"model", "engines", "bundle", "walk"},
    "questions": {"model", "engines", "bundle", "walk", "cni"},
    "renderers": {"model", "questions"},        # the trace model and the questions' results
    "collectors": {"model", "bundle"},          # write and validate bundles; never parse
    "cli": set(STAGES),
}
# CNI names that only the CNI's own package (and the places below) may use in code
CNI_NAMES = ("antrea", "cilium", "calico", "flannel", "aws-node", "aws_node", "vpc-cni",
             "vpc_cni", "azure")
# where CNI names belong: the registry, each CNI's package, the engine that reads Cilium's own
# map dumps, the converters of a CNI's own archives and what CNIs leave on nodes
# (bundle/foreign, named after who writes them), and live collection (which knows each CNI's
# agent and its commands)
CNI_NAMES_ALLOWED = ("traceflow/cni/", "traceflow/engines/cilium/", "traceflow/bundle/foreign/",
                     "collectors/")


def _sources() -> dict[str, Path]:
    """module name -> file, for every module of the three top-level packages."""
    out = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("traceflow", "examples"):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _sources()


def stage(module: str) -> str:
    parts = module.split(".")
    if parts[0] in ("renderers", "collectors"):
        return parts[0]
    if module == "traceflow":
        return "model"                # the version string, nothing else
    if module == "traceflow.__main__":
        return "cli"
    return parts[1]


def _target(name: str) -> str | None:
    """The module of ours that ``name`` (a dotted import) lands in, if any."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> dict[str, int]:
    """module -> first line, for every import of ours anywhere in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        for name in names:
            got = _target(name)
            if got is not None and got != module:
                out.setdefault(got, node.lineno)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def _cycles(graph: dict[str, set]) -> list[list[str]]:
    """One circle (a -> ... -> a) per strongly connected component of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:            # Tarjan; the graph is a few hundred nodes deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(_circle(graph, set(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle(graph: dict[str, set], comp: set[str]) -> list[str]:
    """A shortest circle through the component's first module, for the failure message."""
    start = min(comp)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph.get(v, ())):
            if w == start:
                return paths[v] + [start]
            if w in comp and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return sorted(comp)


def _edges(module: str) -> list[tuple[str, int]]:
    return sorted(GRAPH[module].items(), key=lambda kv: kv[1])


# ---- imports ----------------------------------------------------------------------------------

def test_every_module_has_a_stage():
    assert {stage(m) for m in MODULES} <= set(STAGES)


def test_no_import_circles():
    circles = _cycles({m: set(GRAPH[m]) for m in MODULES})
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_no_circles_between_engines():
    engines: dict[str, set] = {}
    for m in MODULES:
        if stage(m) == "engines" and m.count(".") >= 2:
            own = ".".join(m.split(".")[:3])
            engines.setdefault(own, set()).update(
                ".".join(t.split(".")[:3]) for t in GRAPH[m]
                if stage(t) == "engines" and t.count(".") >= 2 and not t.startswith(own))
    circles = _cycles(engines)
    assert not circles, "engines import each other in a circle:\n" + "\n".join(
        " -> ".join(c) for c in circles)


def test_imports_point_down_the_stages():
    wrong = []
    for m in MODULES:
        mine = stage(m)
        for target, line in _edges(m):
            theirs = stage(target)
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{MODULES[m].relative_to(ROOT)}:{line}: {m} ({mine}) imports "
                             f"{target} ({theirs})")
    assert not wrong, "imports that point up the stage order:\n" + "\n".join(wrong)


def test_nothing_imports_the_cli():
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {t}"
             for m in MODULES if stage(m) != "cli"
             for t, line in _edges(m) if stage(t) == "cli"]
    inside = [f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {t}"
              for m in MODULES if m.startswith("traceflow.cli")
              for t, line in _edges(m) if t == "traceflow.cli"]
    assert not wrong and not inside, "\n".join(wrong + inside)
    users = {m for m in MODULES for t in GRAPH[m]
             if t.startswith("traceflow.cli") and not m.startswith("traceflow.cli.")}
    assert users == {"traceflow.__main__"}


def test_only_the_registry_imports_a_cni_package():
    wrong = []
    for m in MODULES:
        for target, line in _edges(m):
            parts = target.split(".")
            if parts[:2] != ["traceflow", "cni"] or len(parts) < 3:
                continue
            own = ".".join(parts[:3])
            if m != "traceflow.cni" and m != own and not m.startswith(own + "."):
                wrong.append(f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {target}")
    assert not wrong, "only traceflow.cni (the registry) may import a CNI's package:\n" + \
        "\n".join(wrong)


def test_walk_and_snapshot_never_import_cni_or_intent():
    for m in MODULES:
        if stage(m) in ("walk", "bundle"):
            assert not any(stage(t) == "cni" for t in GRAPH[m]), m
    assert "traceflow.walk.intent" not in GRAPH["traceflow.walk.core"]


# ---- CNI names ----------------------------------------------------------------------------------

def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def cni_names_in_code(path: Path) -> list[str]:
    """``line: token`` for every identifier or string literal (docstrings and comments
    aside) that names a CNI."""
    text = path.read_text()
    docs = _docstring_lines(ast.parse(text))
    found = []
    pattern = re.compile("|".join(re.escape(n) for n in CNI_NAMES), re.I)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.NAME, tokenize.STRING) and \
                tok.type != getattr(tokenize, "FSTRING_MIDDLE", -1):
            continue
        if tok.type != tokenize.NAME and tok.start[0] in docs:
            continue
        if pattern.search(tok.string):
            found.append(f"{tok.start[0]}: {tok.string[:60]}")
    return found


def test_no_cni_names_outside_their_packages():
    wrong = []
    for m, path in MODULES.items():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(CNI_NAMES_ALLOWED):
            continue
        wrong += [f"{rel}:{hit}" for hit in cni_names_in_code(path)]
    assert not wrong, "CNI names in code outside the CNI packages (ask traceflow.cni):\n" + \
        "\n".join(wrong)


def test_the_cni_name_check_sees_code_and_skips_docstrings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Antrea and Cilium are named here, in a docstring."""\n'
                      "# and here, in a comment: calico\n"
                      "def f():\n"
                      "    '''Flannel in a docstring.'''\n"
                      "    return AntreaThing, f'{x} cilium'\n"
                      "NAME = 'aws-node'\n")
    hits = cni_names_in_code(sample)
    assert [h.split(":")[0] for h in hits] == ["5", "5", "6"], hits


# ---- sizes --------------------------------------------------------------------------------------

def test_no_file_is_too_long():
    files = [p for top in TOPS + ("tools",) for p in (ROOT / top).rglob("*.py")]
    long = {p.relative_to(ROOT).as_posix(): n for p in files
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    unexplained = {f: n for f, n in long.items() if f not in LONG_FILES}
    assert not unexplained, f"files over {MAX_LINES} lines (split them along a seam): " \
        f"{unexplained}"
    assert not set(LONG_FILES) - set(long), "LONG_FILES lists files that are short now"


def test_the_installed_package_holds_no_tools():
    assert not list((ROOT / "traceflow" / "examples").rglob("*.py"))


# ---- the README's map ---------------------------------------------------------------------------

def _readme_packages() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    out, parents = [], {}
    for line in block.splitlines():
        m = re.match(r"^( *)(\S+/)(\s|$)", line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        parents[depth] = m.group(2)
        out.append("".join(parents[d] for d in range(depth + 1)).rstrip("/"))
    return out


def _packages() -> set[str]:
    found = set()
    for top in TOPS:
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(init.parent.relative_to(ROOT).as_posix())
    for top in ("collectors", "renderers"):
        found.add(top)
    return found


def test_readme_layout_lists_every_package():
    listed = set(_readme_packages())
    packages = _packages()
    assert packages - listed == set(), "packages the README's Layout does not list"
    missing = {p for p in listed if not (ROOT / p).is_dir()}
    assert not missing, f"the README's Layout lists folders that do not exist: {missing}"


@pytest.mark.parametrize("module", ["traceflow.walk.core", "traceflow.bundle.snapshot"])
def test_the_graph_is_read(module):
    """The checks above see real imports (guards against a reader that finds nothing)."""
    assert GRAPH[module]
