"""The codebase's own shape: modules a reader takes in at one sitting, short decoder and server
functions, and docs that cite the project or the papers."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 400  # beyond it, the module's docstring says why in a line "Long: ..."
MAX_FUNCTION_LINES = 60  # in draftkit/decode and draftkit/serve, where the hot paths live


def _modules():
    return sorted((ROOT / "draftkit").rglob("*.py"))


def test_a_long_module_says_why_in_its_docstring():
    long = []
    for path in _modules():
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > MAX_MODULE_LINES and not any(
                line.startswith("Long: ") for line in doc.splitlines()):
            long.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not long, f"over {MAX_MODULE_LINES} lines with no 'Long: ...' reason: {long}"


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
