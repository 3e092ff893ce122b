"""The environment variables page: every name draftkit's source reads from or writes to
``os.environ``, found by walking its syntax trees, so a variable added anywhere is listed.

What one means comes from the code too: the comment on the constant that names it
(``KEY_ENV = "DRAFTKIT_SIGNING_KEY"  # ...``), else the docstring of a function that reads it
and names it; the flags whose help names it are listed beside it.
"""

from __future__ import annotations

import ast
import re

from draftkit.labs.sitegen.reference import PACKAGE, cell, code, flag_helps, generated, notes, table


def _constants(trees: dict[str, ast.Module]) -> dict[str, str]:
    """Module-level NAME = "TEXT" assignments across ``trees``: name -> text."""
    found = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    isinstance(node.value.value, str):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, node.value.value)
    return found


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and \
        isinstance(node.value, ast.Name) and node.value.id == "os"


def _uses(tree: ast.Module, constants: dict[str, str]) -> list[tuple[str, str]]:
    """(variable, how: reads / sets / sets if unset / passes to a process) for each use of
    ``os.environ`` in ``tree`` whose name is a string or a constant holding one."""
    def name(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        ident = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else None
        return constants.get(ident)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if _is_environ(node.func.value) and node.func.attr in ("get", "setdefault", "pop"):
                how = "sets if unset" if node.func.attr == "setdefault" else "reads"
                found.append((name(node.args[0]), how))
            elif isinstance(node.func.value, ast.Name) and node.func.value.id == "os" and \
                    node.func.attr == "getenv":
                found.append((name(node.args[0]), "reads"))
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            how = "sets" if isinstance(node.ctx, ast.Store) else "reads"
            found.append((name(node.slice), how))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            found.append((name(node.left), "reads"))
        elif isinstance(node, ast.Dict) and any(k is None and _is_environ(v)
                                                for k, v in zip(node.keys, node.values)):
            found += [(name(k), "sets for a process it starts") for k in node.keys
                      if k is not None]
    return [(n, how) for n, how in found if n and re.fullmatch(r"[A-Z][A-Z0-9_]+", n)]


def _docstrings(tree: ast.Module) -> dict[str, str]:
    """Variable -> the first paragraph of a function's docstring that names it, the first such
    in ``tree`` (``cache_root``'s: "``$DRAFTKIT_CACHE`` or ``~/.cache/draftkit``: ...")."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = (ast.get_docstring(node) or "").split("\n\n")[0]
            for variable in re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", doc):
                found.setdefault(variable, re.sub(r"``?", "`", " ".join(doc.split())))
    return found


def page() -> str:
    """Every environment variable draftkit reads or sets, found in its source."""
    sources = {}  # module -> its source
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] != "sitegen":
            sources[".".join(("draftkit",) + parts).removesuffix(".__init__")] = \
                path.read_text(encoding="utf-8")
    trees = {module: ast.parse(text) for module, text in sources.items()}
    constants = _constants(trees)
    said: dict[str, str] = {}  # variable -> its constant's comment, else a docstring's words
    for text in sources.values():
        for ident, note in notes(text).items():
            if note and re.fullmatch(r"[A-Z][A-Z0-9_]+", constants.get(ident, "")):
                said.setdefault(constants[ident], note)
    for tree in trees.values():
        for variable, doc in _docstrings(tree).items():
            said.setdefault(variable, doc)
    uses: dict[str, dict[str, set]] = {}
    for module, tree in trees.items():
        for variable, how in _uses(tree, constants):
            uses.setdefault(variable, {}).setdefault(how, set()).add(module)
    flags = flag_helps()
    rows: dict[bool, list] = {True: [], False: []}
    for variable in sorted(uses):
        where = "; ".join(f"{how}: " + ", ".join(code(m) for m in sorted(modules))
                          for how, modules in sorted(uses[variable].items()))
        named = sorted({flag for flag, text in flags if re.search(rf"\b{variable}\b", text)})
        rows[variable.startswith("DRAFTKIT_")].append(
            [code(variable), cell(said.get(variable, "")), ", ".join(code(f) for f in named),
             where])
    header = ["variable", "what it is", "flags whose help names it", "where draftkit uses it"]
    return "\n".join(["# Environment variables", "",
                      generated("every use of `os.environ` in draftkit's source"),
                      "## draftkit's own", "", *table(header, rows[True]),
                      "## Other programs' variables draftkit reads or sets", "",
                      "Libraries' and launchers' own variables (Hugging Face, W&B, vLLM, "
                      "torchrun, CUDA): draftkit reads them as those programs define them, or "
                      "sets them for itself or for a process it starts.", "",
                      *table(header, rows[False])])
