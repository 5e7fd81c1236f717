"""The house rules: data flows one way (trace at the bottom; schemes -> probes -> analysis ->
figures, pipelines and cli above), the trace room, analysis and figures import only what docs/design.md
allows them, and no import cycle anywhere in the package, function-local imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "depthscope"

# lower number = lower room; a module may import its own room and those below it
ROOMS = {
    "depthscope._version": 0,
    "depthscope.errors": 0,
    "depthscope.atomic": 0,
    "depthscope.progress": 0,
    "depthscope.resources": 0,
    "depthscope.interrupt": 0,
    "depthscope.inputs": 0,
    "depthscope.corpus": 0,
    "depthscope.zoo": 0,
    "depthscope.trace": 0,
    "depthscope.schemes": 1,
    "depthscope.train": 1,
    "depthscope.probes": 2,
    "depthscope.analysis": 3,
    "depthscope.figures": 4,
    "depthscope.pipelines": 5,
    "depthscope.cli": 6,
    "depthscope.__main__": 6,
    "depthscope": 7,  # the package's own facade (depthscope/__init__.py)
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> int:
    best = max((k for k in ROOMS if module == k or module.startswith(k + ".")), key=len)
    return ROOMS[best]


def imports(path: Path) -> set[str]:
    """Every depthscope module a file imports, at top level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("depthscope")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("depthscope"):
            for a in node.names:  # `from depthscope.probes import trace` may name a submodule
                sub = f"{node.module}.{a.name}"
                base = PACKAGE.parent / sub.replace(".", "/")
                out.add(
                    sub
                    if base.with_suffix(".py").exists() or (base / "__init__.py").exists()
                    else node.module
                )
    return out


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_rooms_import_only_downwards():
    wrong = [
        f"{m} (room {room(m)}) imports {d} (room {room(d)})"
        for m, deps in graph().items()
        for d in deps
        if room(d) > room(m)
    ]
    assert not wrong, "\n".join(wrong)


# What a room may import besides itself (function-local imports included): the trace room is the
# ground floor; analysis and figures know traces, never the models that produced them.
GROUND = {"depthscope.errors", "depthscope.atomic", "depthscope._version", "depthscope.resources"}
ALLOWED = {
    "depthscope.trace": GROUND,
    "depthscope.analysis": GROUND | {"depthscope.trace"},
    "depthscope.figures": GROUND | {"depthscope.trace", "depthscope.analysis"},
}


def _room_name(module: str) -> str:
    return max((k for k in ROOMS if module == k or module.startswith(k + ".")), key=len)


def test_trace_analysis_and_figures_import_only_what_they_may():
    wrong = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        if (own := _room_name(m)) in ALLOWED
        for d in deps
        if _room_name(d) != own and _room_name(d) not in ALLOWED[own]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_rule_sees_function_local_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from depthscope.schemes import base\n    import depthscope.probes.capture\n")
    assert imports(f) == {"depthscope.schemes.base", "depthscope.probes.capture"}


def test_no_import_cycles():
    g = graph()
    modules = set(g)

    def target(d: str) -> str | None:
        while d and d not in modules:
            d = d.rpartition(".")[0]
        return d or None

    edges = {m: {t for d in deps if (t := target(d)) and t != m} for m, deps in g.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                cycle.extend(path[path.index(d) :] + [m, d] if d in path else [m, d])
                return True
            if d not in state and visit(d, path + [m]):
                return True
        state[m] = 2
        return False

    for m in sorted(edges):
        if m not in state and visit(m, []):
            break
    assert not cycle, " -> ".join(cycle)
