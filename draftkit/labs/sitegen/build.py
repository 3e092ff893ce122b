"""Assemble the docs tree from the checkout and build it with ``mkdocs build --strict``.

The tree keeps the repository's layout, so a guide's relative links mean on the site what they
mean on GitHub: every Markdown page of the guides' folders at its own path (README.md is the
home page), and every other file a page links to (a script, a config, a plot, a report's JSON)
copied beside it as an asset, rather than rewritten to a repository URL: the site then works
offline and shows the files of the commit it was built from. A link to a file that does not
exist is copied as nothing, so mkdocs names it and the strict build fails; the same for a
missing anchor, and for a page that the nav leaves out.

``eval/results`` is copied whole, and each of its folders without a README gets a generated
``index.md`` listing its files (a report's plots shown): a link to a folder, which GitHub
answers with the folder's listing, is pointed at that page (or at the folder's README.md).

The nav is explicit (:data:`NAV`); only the dated results (``eval/results/notes``, the
committed reports) are listed from their folders, oldest first, as records rather than pages
someone places.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from draftkit.errors import DraftkitError
from draftkit.extras import require
from draftkit.labs.sitegen import compat, environment, reference

ROOT = Path(__file__).resolve().parents[3]  # the checkout this package sits in
# the folders whose Markdown files are pages, besides the top level's README.md and CHANGELOG.md
PAGE_FOLDERS = ("recipes", "eval", "serve", "draftkit")
LEFT_OUT = ("draftkit/share",)  # links to eval/ and recipes/ for the wheel: the same files
RESULTS = "eval/results"
REFERENCE = {  # the generated reference: file under reference/ -> (nav title, page function)
    "commands.md": ("Commands and flags", reference.commands_page),
    "recipe-keys.md": ("Recipe keys", reference.recipe_keys_page),
    "manifest.md": ("Bundle manifest", reference.manifest_page),
    "metrics.md": ("Metrics", reference.metrics_page),
    "exit-codes.md": ("Exit statuses", reference.exit_codes_page),
    "environment.md": ("Environment variables", environment.page),
}
NAV = [  # (title, page or section); RESULTS' notes and reports are added by results_nav
    ("Home", "README.md"),
    ("Guides", [
        ("A head for your own model", "recipes/your-own-model.md"),
        ("Distilling a draft", "recipes/README.md"),
        ("EAGLE-3 at scale", "recipes/eagle3-at-scale.md"),
        ("Evaluating a draft", "eval/README.md"),
        ("Serving", "serve/README.md"),
        ("Commands and layout", "draftkit/README.md"),
        ("Benchmark scripts", "eval/benchmarks/README.md"),
    ]),
    ("Reference", [(title, f"reference/{name}") for name, (title, _) in REFERENCE.items()]),
    ("Compatibility", "compatibility.md"),
    ("Results", [
        ("Measured results", f"{RESULTS}/README.md"),
        ("GPU tables", f"{RESULTS}/gpu.md"),
    ]),
    ("Changelog", "CHANGELOG.md"),
]
# links (Markdown's [text](target) and ![alt](target), reference definitions, HTML src/href)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)|"
                  r"(?:src|href)=[\"']([^\"']+)[\"']", re.M)


def pages(root: Path) -> list[Path]:
    """Every Markdown page of the site, relative to ``root``."""
    found = [Path(p) for p in ("README.md", "CHANGELOG.md") if (root / p).is_file()]
    for folder in PAGE_FOLDERS:
        found += sorted(p.relative_to(root) for p in (root / folder).rglob("*.md")
                        if not any(p.relative_to(root).as_posix().startswith(s)
                                   for s in LEFT_OUT))
    return found


def linked_files(root: Path, page: Path) -> set[Path]:
    """The files other than pages that ``page`` (relative to ``root``) links to and that exist
    in the checkout, relative to ``root``. A link leaving the checkout is not followed."""
    text = (root / page).read_text(encoding="utf-8")
    found = set()
    for match in LINK.finditer(text):
        target = next(g for g in match.groups() if g)
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):  # a URL, an anchor, absolute
            continue
        path = (root / page.parent / target.split("#")[0].split("?")[0]).resolve()
        if path.is_file() and path.suffix != ".md" and path.is_relative_to(root):
            found.add(path.relative_to(root))
    return found


def _title(page: Path) -> str:
    """A page's first heading, else its file name."""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return page.stem


def write_listings(docs: Path) -> None:
    """An ``index.md`` in each folder under RESULTS in ``docs`` that has no README.md: its
    pages by their headings, its plots shown, its other files linked."""
    for folder in sorted(p for p in (docs / RESULTS).rglob("*") if p.is_dir()):
        if (folder / "README.md").exists():
            continue
        lines = [f"# {folder.relative_to(docs / RESULTS).as_posix()}", "",
                 "The files of this folder, as committed.", ""]
        for item in sorted(folder.iterdir()):
            if item.is_dir():
                lines.append(f"- [{item.name}/]({item.name}/index.md)")
            elif item.suffix == ".md" and item.name != "index.md":
                title = _title(item)
                lines.append(f"- [{title}]({item.name})" +
                             (f" ({item.name})" if title != item.stem else ""))
            elif item.suffix != ".png" and item.name != "index.md":
                lines.append(f"- [{item.name}]({item.name})")
        lines += [""] + [f"![{p.name}]({p.name})\n" for p in sorted(folder.glob("*.png"))]
        (folder / "index.md").write_text("\n".join(lines), encoding="utf-8")


def results_nav(docs: Path) -> list:
    """The notes and reports under RESULTS in ``docs``, as nav entries: each folder a section
    whose first page is its listing (its index.md), notes by their headings, a report's pages
    by their file names."""
    def section(folder: Path, listing: str = "Files") -> list:
        entries = [(listing, (folder / "index.md").relative_to(docs).as_posix())]
        for item in sorted(folder.iterdir()):
            if item.is_dir():
                entries.append((item.name, section(item)))
            elif item.suffix == ".md" and item.name != "index.md":
                title = _title(item) if folder.name == "notes" else item.stem
                entries.append((title, item.relative_to(docs).as_posix()))
        return entries

    return [("Notes", section(docs / RESULTS / "notes", "All notes")),
            ("Reports", section(docs / RESULTS / "reports", "All reports"))]


def point_folder_links(docs: Path, page: Path) -> None:
    """Rewrite ``page``'s links to a folder of ``docs`` (``notes/``) as links to the folder's
    README.md or index.md."""
    def point(match: re.Match) -> str:
        folder = page.parent / match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:|^/", match.group(1)) or not folder.is_dir():
            return match.group(0)
        name = "README.md" if (folder / "README.md").exists() else "index.md"
        return match.group(0).replace(match.group(1), match.group(1) + name, 1)

    text = page.read_text(encoding="utf-8")
    pointed = re.sub(r"\]\(\s*([^)\s#]+/)(?=[#)\s])", point, text)
    if pointed != text:
        page.write_text(pointed, encoding="utf-8")


def _nav(entries: list) -> list:
    """NAV's (title, page or section) pairs as mkdocs' list of one-key mappings."""
    return [{title: _nav(value) if isinstance(value, list) else value}
            for title, value in entries]


class _Call:
    """A YAML ``!!python/object/apply`` value, which mkdocs' loader builds."""

    def __init__(self, function: str, **kwds):
        self.function, self.kwds = function, kwds


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Call, lambda dumper, call: dumper.represent_mapping(
    f"tag:yaml.org,2002:python/object/apply:{call.function}", {"kwds": call.kwds}))


def config(nav: list, site_name: str = "draftkit") -> dict:
    """The mkdocs config: the Material theme, GitHub's heading anchors (so the guides' links to
    a section hold on both), and every link, anchor and nav check raised to a warning, which
    ``--strict`` turns into a failed build."""
    return {
        "site_name": site_name,
        "site_description": "Train, evaluate, export and serve draft models for speculative "
                            "decoding.",
        "docs_dir": "docs",
        "use_directory_urls": False,  # the built site also reads from disk, file by file
        "theme": {"name": "material",
                  "font": False,  # the system's fonts: no request to Google Fonts, offline too
                  "features": ["navigation.sections", "navigation.top", "content.code.copy",
                               "search.highlight"]},
        "plugins": ["search"],
        "markdown_extensions": [
            "tables", "attr_list", "pymdownx.superfences",
            {"toc": {"permalink": True,
                     "slugify": _Call("pymdownx.slugs.slugify", case="lower")}},
        ],
        "validation": {
            "nav": {"omitted_files": "warn", "not_found": "warn", "absolute_links": "warn"},
            "links": {"not_found": "warn", "anchors": "warn", "absolute_links": "warn",
                      "unrecognized_links": "warn"},
        },
        "nav": _nav(nav),
    }


def write_config(tree: Path, nav: list) -> Path:
    """``tree``/mkdocs.yml for the pages in ``tree``/docs and ``nav``; returns its path."""
    path = tree / "mkdocs.yml"
    path.write_text(yaml.dump(config(nav), Dumper=_Dumper, sort_keys=False), encoding="utf-8")
    return path


def _rendered_twice(folder: str, names: list[str]) -> list[str]:
    """A report's report.html beside its report.md: the site renders the Markdown one to the
    same file name."""
    return [n for n in names if n.endswith(".html") and n[:-5] + ".md" in names]


def assemble(tree: Path, root: Path = ROOT) -> Path:
    """Write the docs tree for the checkout at ``root`` into ``tree`` (``tree/docs`` and
    ``tree/mkdocs.yml``); returns the config's path."""
    docs = tree / "docs"
    shutil.rmtree(docs, ignore_errors=True)  # an earlier build's tree
    found = pages(root)
    shutil.copytree(root / RESULTS, docs / RESULTS, ignore=_rendered_twice)
    for path in [*found, *sorted(set().union(*(linked_files(root, p) for p in found)))]:
        (docs / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / path, docs / path)
    write_listings(docs)
    for page in found:
        point_folder_links(docs, docs / page)
    (docs / "reference").mkdir(parents=True, exist_ok=True)
    for name, (_, make) in REFERENCE.items():
        (docs / "reference" / name).write_text(make() + "\n", encoding="utf-8")
    (docs / "compatibility.md").write_text(compat.page(root) + "\n", encoding="utf-8")
    nav = [(title, value + results_nav(docs) if title == "Results" else value)
           for title, value in NAV]
    return write_config(tree, nav)


def mkdocs_build(config_path: Path, out: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``config_path`` into ``out``; its output captured."""
    require("docs", "the docs site")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(config_path), "--site-dir", str(Path(out).resolve())],
                          capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner


def build(out: str | Path, root: Path = ROOT, tree: str | Path | None = None
          ) -> subprocess.CompletedProcess:
    """The site of the checkout at ``root``, built strictly into ``out``; the docs tree in
    ``tree`` (kept) or a temporary folder."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / "sitemap.xml").exists():
        raise DraftkitError(f"{out} is a folder with files and not a site this built; mkdocs "
                            f"would empty it: give a new or empty folder")
    for needed in ("README.md", RESULTS):
        if not (root / needed).exists():
            raise DraftkitError(f"the docs site is built from a checkout of draftkit; {root} "
                                f"has no {needed}")
    if tree is not None:
        Path(tree).mkdir(parents=True, exist_ok=True)
        return mkdocs_build(assemble(Path(tree), root), out)
    with tempfile.TemporaryDirectory(prefix="draftkit-docs-") as tmp:
        return mkdocs_build(assemble(Path(tmp), root), out)
