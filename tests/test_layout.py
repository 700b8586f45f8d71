"""Tests of the folders' import rules: utils/ imports no script and no tool, the tools import no
speed benchmark, no script imports another, and no module imports itself back through others."""

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("ppo_breakout", "pqn_minatar", "dqn_minatar", "sr_dqn_minatar", "loss_stability")


def modules() -> dict[str, str]:
    """Each of the project's modules (dotted name) and its file."""
    files = [*glob.glob("*.py", root_dir=ROOT)]
    for folder in ("utils", "tools", "speed"):
        files += glob.glob(f"{folder}/*.py", root_dir=ROOT)
    return {f[:-3].replace("/", ".").removesuffix(".__init__"): os.path.join(ROOT, f)
            for f in files}


def imports(file: str, known: set[str]) -> set[str]:
    """The project's modules that `file` imports, at its top or inside a function."""
    found = set()
    with open(file) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def graph() -> dict[str, set[str]]:
    known = set(modules())
    return {name: imports(file, known) - {name} for name, file in modules().items()}


def test_the_graph_sees_the_imports_it_must():
    edges = graph()
    assert "utils.training" in edges["ppo_breakout"]
    assert "tools.common" in edges["speed.loop_speed"] and "tools.tune" in edges["speed.loop_speed"]
    assert "tools.figures" in edges["tools.make_tables"]  # imported inside a function


def test_utils_imports_no_script_tool_or_speed_benchmark():
    for name, imported in graph().items():
        if name.startswith("utils"):
            assert not {m for m in imported if not m.startswith("utils")}, name


def test_the_tools_import_no_speed_benchmark_and_no_script_imports_another():
    for name, imported in graph().items():
        if name.startswith("tools."):
            assert not {m for m in imported if m.startswith("speed.")}, name
        if name in SCRIPTS:
            assert not set(imported) & set(SCRIPTS), name


def test_no_module_imports_itself_back_through_others():
    edges = graph()

    def reaches(start: str) -> set[str]:
        seen, todo = set(), list(edges[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(edges.get(name, ()))
        return seen

    circles = sorted(name for name in edges if name in reaches(name))
    assert not circles, circles
