"""The package's imports as the layout tests read them: each module's name, and the draftkit
modules each import statement names, relative ones made absolute."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules() -> list[Path]:
    return sorted((ROOT / "draftkit").rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def base(node: ast.ImportFrom, path: Path) -> str:
    """The module a ``from X import ...`` in ``path`` reads from, a relative one made absolute
    (from the package ``path`` is in)."""
    if not node.level:
        return node.module or ""
    name = module_name(path)
    package = name.split(".")[:len(name.split(".")) - (path.name != "__init__.py")]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def typing_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:``."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}


def imports(path: Path, names: set[str], *, for_typing: bool = True) -> list[tuple[str, int]]:
    """(draftkit module, line) of every import in ``path`` of a module in ``names``, at its top
    or inside a function (a function-local import is still a dependency); ``for_typing``: also
    those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skip = set() if for_typing else typing_only(tree)
    name, found = module_name(path), []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            b = base(node, path)
            # ``from package import module`` imports the module; other names, the package
            targets = [f"{b}.{a.name}" if f"{b}.{a.name}" in names else b for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found
