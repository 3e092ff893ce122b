"""The package drawing in draftkit/README.md ("Floors"), held to the code: every package on one
floor, every import (at a module's top, inside a function, or for type checking alone) pointing
to its own floor or one below, no loop between packages, and the core never importing labs."""

import re

from tests.foundation.imports import ROOT, imports, module_name, modules

PACKAGE = ROOT / "draftkit"
LABS = "labs"


def _unit(module: str) -> str:
    """The drawing's unit a module belongs to: its package under draftkit/ (``decode`` for
    draftkit.decode.engine), or a top-level module's own name (``config``)."""
    return module.split(".")[1] if "." in module else "__init__"


def _graph() -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) -> where, for every import between two units."""
    paths = {module_name(p): p for p in modules()}
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in paths.items():
        for target, line in imports(path, set(paths)):
            if _unit(module) != _unit(target):
                edges.setdefault((_unit(module), _unit(target)), []).append(
                    f"{path.relative_to(ROOT)}:{line} imports {target}")
    return edges


def _floors() -> list[list[str]]:
    """The drawing's floors, top first, as draftkit/README.md draws them: lines ``name: a, b``
    (an indented line goes on with the floor above it) in the fenced block after the heading
    "Floors"."""
    text = (PACKAGE / "README.md").read_text()
    block = re.search(r"### Floors\n.*?```\n(.*?)```", text, re.S)
    assert block, "draftkit/README.md has no '### Floors' drawing"
    floors: list[list[str]] = []
    for line in block.group(1).splitlines():
        units = [u.strip() for u in line.partition(":")[2 if line[:1].strip() else 0].split(",")]
        if line[:1].strip():
            floors.append([])
        floors[-1] += [u for u in units if u]
    return floors


def test_every_package_is_drawn_once():
    drawn = [u for floor in _floors() for u in floor]
    units = {_unit(module_name(p)) for p in modules()}
    assert sorted(set(drawn)) == sorted(drawn), "drawn twice"
    assert sorted(units - set(drawn)) == [], "not in draftkit/README.md's floors"
    assert sorted(set(drawn) - units) == [], "drawn, but not in the package"


def test_no_arrow_back_up():
    """A package imports only from its own floor or the floors below it."""
    floors = _floors()
    height = {u: len(floors) - i for i, floor in enumerate(floors) for u in floor}
    up = [w for (a, b), where in _graph().items() if height[b] > height[a] for w in where]
    assert not up, "imports up the drawing:\n" + "\n".join(up)


def test_no_loop_between_packages():
    edges = _graph()
    out: dict[str, set[str]] = {}
    for a, b in edges:
        out.setdefault(a, set()).add(b)
    loops, state = [], {}

    def walk(u: str, path: list[str]) -> None:
        state[u] = 1
        for v in sorted(out.get(u, ())):
            if state.get(v) == 1:
                loop = path[path.index(v):] + [v]
                loops.append(" -> ".join(loop) + ": " + "; ".join(
                    edges[(x, y)][0] for x, y in zip(loop, loop[1:])))
            elif v not in state:
                walk(v, path + [v])
        state[u] = 2

    for u in sorted(out):
        if u not in state:
            walk(u, [u])
    assert not loops, "\n".join(loops)


def test_the_core_never_imports_labs():
    """Labs (draftkit/labs: development tools, experiments) may import the core; the core, the
    path a user's train -> decode -> export -> serve run needs, imports no labs module. The
    CLI names a labs command by its module path and imports it only when that command runs."""
    into_labs = [w for (a, b), where in _graph().items() if b == LABS and a != LABS
                 for w in where]
    assert not into_labs, "the core imports labs:\n" + "\n".join(into_labs)
