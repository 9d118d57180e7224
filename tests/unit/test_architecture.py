"""The package's structure is what docs/architecture.md says (pure: reads the code's imports).

* every package of ``airflow_kafka_backpressure`` (and root module) is in the page's layer table,
  and every import between two of them runs to a lower layer;
* no module sits at the package's root but the entry points the page names;
* no modules import each other in a loop.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = "airflow_kafka_backpressure"
ROOT = REPO / PKG
PAGE = REPO / "docs" / "architecture.md"
ENTRY_POINTS = {"__init__", "dag_factory", "get_provider_info"}


def layers() -> dict[str, int]:
    """The layer of each package (or root module), from the page's table."""
    found = {}
    for layer, name in re.findall(r"^\| (\d+) \| `(\w+)` \|", PAGE.read_text(), flags=re.M):
        found[name] = int(layer)
    found["get_provider_info"] = 1
    return found


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """The package's modules (or names in them) that ``name`` imports."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == PKG or target.startswith(PKG + "."):
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PKG + "."))
    return found


def unit(module: str) -> str:
    return module.split(".")[1]


def test_every_import_between_packages_runs_down_the_pages_layers():
    table = layers()
    mods = modules()
    units = {unit(m) for m in mods if m != PKG}
    assert units <= set(table), (
        f"packages missing from docs/architecture.md's layer table: {sorted(units - set(table))}"
    )
    wrong = []
    for name, path in sorted(mods.items()):
        if name == PKG:
            continue
        src = unit(name)
        for target in imports(name, path):
            known = next((m for m in (target, target.rpartition(".")[0]) if m in mods), None)
            if known is None or known == PKG:
                continue
            dst = unit(known)
            if dst != src and table[dst] >= table[src]:
                wrong.append(f"{name} (layer {table[src]}) imports {known} (layer {table[dst]})")
    assert not wrong, "\n".join(wrong)


def test_only_the_entry_points_sit_at_the_packages_root():
    at_root = {p.stem for p in ROOT.glob("*.py")}
    assert at_root == ENTRY_POINTS, sorted(at_root - ENTRY_POINTS)


def test_no_modules_import_each_other_in_a_loop():
    mods = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for target in imports(name, path):
            known = next((m for m in (target, target.rpartition(".")[0]) if m in mods), None)
            # a package's face (its __init__) re-exports its modules: not an edge back to them
            if known is not None and known != name and not name.startswith(known + "."):
                graph[name].add(known)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    assert not loops, loops


def test_the_package_imports_none_of_the_demos_or_tests_tooling():
    """``kbp_local`` (the demo's and the tests' servers), ``tests`` and ``bench`` are not in the wheel:
    an import of them from the package would break every installed deployment."""
    tooling = ("kbp_local", "tests", "bench")
    found = []
    for name, path in sorted(modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [f"{name} imports {t}" for t in targets if t.split(".")[0] in tooling]
    assert not found, found
