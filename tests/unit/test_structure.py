"""The code's layout: module_utils in stage packages reached one way, and the Python range the
project declares is the one the Makefile supports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ansible.module_utils
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "module_utils"
# Ansible's own module_utils names (ansible-core 2.19): a stage named like one would shadow it
# or be shadowed.
ANSIBLE_OWN = {path.stem for path in Path(ansible.module_utils.__file__).parent.iterdir()}
PRODUCT = ["library", "module_utils", "analysis", "filter_plugins", "callback_plugins"]


def python_files(*folders: str):
    for folder in folders:
        yield from sorted((REPO / folder).rglob("*.py"))


def test_every_module_util_is_in_a_stage_package_that_ansible_does_not_own():
    stages = {path.parent.name for path in KIT.glob("*/__init__.py")}
    assert stages and not stages & ANSIBLE_OWN
    for path in KIT.rglob("*.py"):
        if path.parent != KIT:
            assert (path.parent / "__init__.py").exists(), path
    assert [path.name for path in KIT.glob("*.py")] == ["__init__.py"]


def test_the_kit_is_reached_one_way():
    """ansible.module_utils.<stage>.<name> everywhere: nobody appends to Ansible's __path__
    (module_utils/__init__.py's finder does the controller's part), nobody imports the same
    files as top-level module_utils.<x> (a second copy whose exceptions do not match)."""
    for path in python_files(*PRODUCT, "tests"):
        if path == KIT / "__init__.py" or ".state" in path.parts:
            continue
        text = path.read_text()
        assert not re.search(r"module_utils\.__path__\.(append|insert)", text), path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("module_utils"), (path, node.lineno)
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
                assert all(n == "module_utils" or not n.startswith("module_utils") for n in names)


def test_the_declared_python_range_is_the_makefile_s_controllers():
    makefile = (REPO / "Makefile").read_text()
    supported = re.search(r"^CONTROLLER_PYTHONS := (.+)$", makefile, re.M).group(1).split()
    declared = re.search(
        r'^requires-python = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M
    ).group(1)
    admitted = [f"3.{minor}" for minor in range(8, 20) if f"3.{minor}.0" in SpecifierSet(declared)]
    assert admitted == supported


def analysis_imports() -> dict[str, set[str]]:
    """Which analysis modules each one imports, imports inside functions included."""
    names = {path.stem for path in (REPO / "analysis").glob("*.py")}
    graph = {}
    for path in (REPO / "analysis").glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "analysis":
                found |= {alias.name for alias in node.names} & names
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("analysis."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {
                    a.name.split(".")[1] for a in node.names if a.name.startswith("analysis.")
                }
        graph[path.stem] = found - {path.stem}
    return graph


def test_the_analysis_package_has_no_import_cycle():
    graph = analysis_imports()
    assert graph["tables"] and graph["report"]  # the graph is read, not empty

    def reaches(start: str, goal: str, seen: set) -> bool:
        for name in graph.get(start, ()):
            if name == goal or (name not in seen and reaches(name, goal, seen | {name})):
                return True
        return False

    assert [name for name in sorted(graph) if reaches(name, name, set())] == []


MAX_FUNCTION_LINES, MAX_FILE_LINES = 80, 600
# Units allowed over the limits: none since issue 32's splits. A unit that grows past them is
# split, not listed here.
STILL_LONG: set[str] = set()


def function_lengths(tree: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every def, from its first decorator to its last line; methods
    and nested functions count on their own."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            yield f"{prefix}{node.name}", node.end_lineno - first + 1
            yield from function_lengths(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from function_lengths(node, f"{prefix}{node.name}.")
        else:
            yield from function_lengths(node, prefix)


def long_units() -> dict[str, int]:
    found = {}
    for path in python_files(*PRODUCT):
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_FILE_LINES:
            found[rel] = len(text.splitlines())
        for name, lines in function_lengths(ast.parse(text, rel)):
            if lines > MAX_FUNCTION_LINES:
                found[f"{rel}:{name}"] = lines
    return found


def test_no_product_function_over_80_lines_and_no_file_over_600_but_the_listed_ones():
    found = long_units()
    new = {unit: lines for unit, lines in found.items() if unit not in STILL_LONG}
    assert not new, f"over {MAX_FUNCTION_LINES} lines a function or {MAX_FILE_LINES} a file: {new}"
    gone = sorted(STILL_LONG - set(found))
    assert not gone, f"now short: take them off STILL_LONG so they stay short: {gone}"
