"""The codebase's own shape: modules a reader takes in at one sitting, short decoder and server
functions, imports at a module's top and no import cycle, a batch's state held by the batch
alone, and docs that cite the project or the papers."""

import ast
import re
from pathlib import Path

from tests.foundation.imports import ROOT, base, imports, module_name, modules, typing_only
MAX_MODULE_LINES = 400  # beyond it, the module's docstring says why in a line "Long: ..."
MAX_FUNCTION_LINES = 60  # in draftkit/decode and draftkit/serve, where the hot paths live
MAX_LOCAL_DRAFTKIT_IMPORTS = 10  # function-local, each for an optional extra or a stated reason
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
RESULTS_PATH = re.compile(r"eval/results/\S*")  # a note or report, named by its date
# the modules that import torch inside a function: the CLI (its --help imports no torch), and
# vLLM's worker and its CPU fix, which run in vLLM's environment, after their own set-up
LOCAL_TORCH = {"draftkit/cli.py", "draftkit/engines/vllm_worker.py",
               "draftkit/engines/vllm_cpu_fix.py"}


def test_a_long_module_says_why_in_its_docstring():
    long = []
    for path in modules():
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > MAX_MODULE_LINES and not any(
                line.startswith("Long: ") for line in doc.splitlines()):
            long.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not long, f"over {MAX_MODULE_LINES} lines with no 'Long: ...' reason: {long}"


def test_lines_fit_in_100_columns():
    wide = [f"{p.relative_to(ROOT)}:{i}" for p in modules()
            for i, line in enumerate(p.read_text().splitlines(), 1) if len(line) > 100]
    assert not wide, f"lines over 100 characters: {wide}"


def test_decoder_and_server_functions_read_in_one_screen():
    long = []
    for package in ("decode", "serve"):
        for path in sorted((ROOT / "draftkit" / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_docs_and_code_cite_the_project_or_the_papers():
    cited = [f"{p.relative_to(ROOT)}:{i}" for folder in ("draftkit", "eval", "serve", "recipes")
             for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".md", ".yaml")
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if "REFERENCE" + ".md" in line]
    assert not cited, f"cites a file the project does not contain: {cited}"


def test_measured_figures_live_in_the_results_not_the_code():
    """A dated figure in a docstring or comment goes stale with the code it describes: the code
    links the note in eval/results/ that holds it, so a date appears only in such a path."""
    dated = _dated(modules(), lambda line: line)
    assert not dated, f"a date outside an eval/results/ path: {dated}"


def _dated(paths: list[Path], read) -> list[str]:
    """``path:line`` for each line whose part ``read(line)`` holds a date outside an
    eval/results/ path."""
    return [f"{p.relative_to(ROOT)}:{i}" for p in paths
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if DATE.search(RESULTS_PATH.sub("", read(line)))]


def _yaml_comment(line: str) -> str:
    """The comment on a line of YAML: the whole line where it starts with '#', else what
    follows ' #' (a comment beside a key)."""
    stripped = line.strip()
    return stripped if stripped.startswith("#") else line.partition(" #")[2]


def test_recipe_comments_link_their_measured_figures():
    """A recipe's header says what it trains, why its settings and roughly what it costs; the
    figures its runs measured live in eval/results/, which it links, so a date appears in a
    recipe's comments only in such a path (its prompt data, recipes/data/, is not checked)."""
    dated = _dated(sorted((ROOT / "recipes").rglob("*.yaml")), _yaml_comment)
    assert not dated, f"a date outside an eval/results/ path in a recipe's comment: {dated}"


def _local_imports(path: Path) -> list[tuple[ast.stmt, list[str]]]:
    """(import, the modules it names, relative ones absolute) for each import inside a function
    of ``path``."""
    tree = ast.parse(path.read_text())
    found = {}
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                found[id(node)] = (node, [a.name for a in node.names])
            elif isinstance(node, ast.ImportFrom):
                found[id(node)] = (node, [base(node, path)])
    return sorted(found.values(), key=lambda item: item[0].lineno)


def test_modules_import_draftkit_at_their_top():
    """A module imports the draftkit modules it uses at its top, where a reader finds what it
    depends on; a function imports one only for an optional extra (the web stack) or another
    reason its line states (a package's names read on first use, so --help stays light)."""
    local, unexplained = [], []
    for path in modules():
        lines = path.read_text().splitlines()
        for node, named in _local_imports(path):
            if not any(m == "draftkit" or m.startswith("draftkit.") for m in named):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            local.append(where)
            if not any("#" in line for line in lines[node.lineno - 1:node.end_lineno]):
                unexplained.append(where)
    assert len(local) <= MAX_LOCAL_DRAFTKIT_IMPORTS, \
        f"{len(local)} function-local draftkit imports, at most {MAX_LOCAL_DRAFTKIT_IMPORTS}: " \
        f"{local}"
    assert not unexplained, f"function-local draftkit imports with no reason beside: {unexplained}"


def test_torch_is_imported_at_the_top():
    """torch, transformers and safetensors are imported at a module's top, but where
    :data:`LOCAL_TORCH` says why not."""
    local = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in modules()
             if str(path.relative_to(ROOT)) not in LOCAL_TORCH
             for node, named in _local_imports(path)
             if any(m.split(".")[0] in ("torch", "transformers", "safetensors") for m in named)]
    assert not local, f"function-local imports of torch, transformers or safetensors: {local}"


def test_no_import_cycle_in_the_package():
    """Each module can be read knowing only what it imports: no two modules need each other,
    directly or around a loop (a function-local import hides a cycle from Python, not from a
    reader)."""
    paths = {module_name(p): p for p in modules()}
    graph = {m: {t for t, _ in imports(p, set(paths), for_typing=False)}
             for m, p in paths.items()}
    cycles, state = [], {}  # state: 1 on the path being walked, 2 done

    def walk(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(path[path.index(n):] + [n]))
            elif n not in state:
                walk(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m, [m])
    assert not cycles, f"import cycles: {cycles}"


def test_only_the_batch_holds_its_state():
    """A batch's state is private to the module that changes it: only decode/batch.py imports
    ``BatchState`` to run (a drafter, handed it, names it for type checking alone), and
    engine.py imports neither the class nor anything that takes it."""
    holders, typing_names = [], []
    for path in modules():
        tree = ast.parse(path.read_text())
        hidden = typing_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name == "BatchState"
                                                         for a in node.names):
                where = f"{path.relative_to(ROOT)}"
                (typing_names if id(node) in hidden else holders).append(where)
    assert holders == ["draftkit/decode/batch.py"], holders
    assert all(p.startswith("draftkit/decode/") for p in typing_names), typing_names
    engine = ast.parse((ROOT / "draftkit/decode/engine.py").read_text())
    assert "BatchState" not in ast.unparse(engine)
    takes_state = [f"{f.name}({a.arg})" for f in ast.walk(engine)
                   if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")
                   for a in f.args.args + f.args.kwonlyargs if a.arg == "state"]
    assert not takes_state, takes_state


def test_the_state_module_imports_nothing_above_it():
    """decode/state.py sits below the batch and the engine: it imports neither, directly or
    through another module, so the state reads without the decoder around it."""
    paths = {module_name(p): p for p in modules()}
    seen, todo = set(), ["draftkit.decode.state"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(t for t, _ in imports(paths[m], set(paths), for_typing=False))
    above = {"draftkit.decode.batch", "draftkit.decode.engine", "draftkit.decode.drafters"}
    assert not seen & above, seen & above


def test_no_one_reads_another_objects_state():
    """``_state`` is read off ``self`` alone: no module reaches into a batch's."""
    reads = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in modules()
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Attribute) and node.attr == "_state"
             and not (isinstance(node.value, ast.Name) and node.value.id == "self")]
    assert not reads, reads
