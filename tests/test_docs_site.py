"""The docs site (draftkit.labs.sitegen): its reference lists what the code has, its strict build
refuses a broken link, a missing anchor and a page left out of the nav, the real site builds,
and a browser renders its home page and a guide with their plots."""

import http.server
import io
import json
import shutil
import subprocess
import threading
from functools import partial
from pathlib import Path

import pytest

from draftkit.labs.sitegen import build, environment, reference

BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome")


def _sections(page: str) -> dict[str, str]:
    """'## draftkit NAME' section -> its text; '' for the top-level command's."""
    parts = page.split("\n## draftkit")
    return {part.split("\n", 1)[0].strip(): part for part in parts[1:]}


def test_every_flag_of_every_command_is_in_the_reference():
    sections = _sections(reference.commands_page())
    flags = reference.all_flags()
    assert set(flags) == set(sections), "a command without a section, or one too many"
    missing = [f"{name or 'draftkit'} {flag}" for name, names in flags.items()
               for flag in names if f"`{flag}`" not in sections[name]]
    assert not missing, f"flags the reference does not list: {missing}"
    assert "`--trusted-key`" in sections["eval"] and "`--max-steps`" not in sections["eval"]


def test_every_recipe_key_and_manifest_field_is_in_the_reference():
    from draftkit.config import recipe_keys
    from draftkit.distill.config import DistillConfig

    keys = reference.recipe_keys_page()
    assert [k.name for k in recipe_keys(DistillConfig) if f"`{k.name}`" not in keys] == []
    manifest = reference.manifest_page()
    for name in ("format", "target.sha256", "domains.NAME.alpha", "serving.engines.vllm.method",
                 "signing.key_id", "manifest_sha256"):
        assert f"`{name}`" in manifest
    assert "the recommended K" in manifest  # a field's comment in the source, as its text


def test_exit_statuses_metrics_and_environment_come_from_the_code():
    from draftkit import errors

    statuses = reference.exit_codes_page()
    for name in ("EXIT_OK", "EXIT_REFUSED", "EXIT_DECLINED", "EXIT_FAILED"):
        assert f"| {getattr(errors, name)} | `{name}` |" in statuses
    metrics = reference.metrics_page()
    assert "`draftkit:spec_decode_num_accepted_tokens_per_pos_total` | counter | " \
           "`model_name`, `engine`, `position`" in metrics
    env = environment.page()
    for variable in ("DRAFTKIT_SIGNING_KEY", "DRAFTKIT_CACHE", "DRAFTKIT_ADMIN_TOKEN",
                     "HF_HUB_OFFLINE"):
        assert f"`{variable}`" in env
    # read through a constant (TOKEN_ENV), with the comment beside it and the flag that names it
    assert "`draftkit serve --admin-token`" in env


def _needs_mkdocs():
    pytest.importorskip("material", reason="the docs site needs the 'docs' extra (mkdocs, "
                                           "mkdocs-material)")


def _site(tmp_path: Path, page: str, nav_pages: list[str], extra: dict[str, str] = {}):
    docs = tmp_path / "docs"
    docs.mkdir(parents=True)
    (docs / "README.md").write_text(page)
    (docs / "guide.md").write_text("# Guide\n\n## A section\n\nText.\n")
    for name, text in extra.items():
        (docs / name).write_text(text)
    config = build.write_config(tmp_path, [(p, p) for p in nav_pages])
    return build.mkdocs_build(config, tmp_path / "site")


def test_the_strict_build_fails_on_a_broken_link_anchor_or_a_page_left_out(tmp_path):
    _needs_mkdocs()
    ok = _site(tmp_path / "ok", "# Home\n\n[a section](guide.md#a-section)\n",
               ["README.md", "guide.md"])
    assert ok.returncode == 0, ok.stderr
    broken = _site(tmp_path / "broken", "# Home\n\n[gone](no-such-page.md) "
                   "[anchor](guide.md#no-such-section) [ok](guide.md#a-section)\n",
                   ["README.md", "guide.md"], {"left-out.md": "# Left out\n"})
    assert broken.returncode != 0
    said = broken.stdout + broken.stderr
    for fault in ("'no-such-page.md'", "'#no-such-section'", "left-out.md",
                  "Aborted with 3 warnings in strict mode"):
        assert fault in said, said


def test_links_to_source_files_are_copied_and_folder_links_reach_a_page(tmp_path):
    root = tmp_path / "repo"
    (root / "serve").mkdir(parents=True)
    (root / "serve" / "client.py").write_text("print('hi')\n")
    page = root / "serve" / "README.md"
    page.write_text("[client](client.py) [gone](gone.py) [site](https://x.org/a.py) "
                    "[home](../README.md) ![plot](../eval/p.png)\n")
    assert build.linked_files(root, Path("serve/README.md")) == {Path("serve/client.py")}
    docs = tmp_path / "docs"
    (docs / "eval" / "results" / "notes").mkdir(parents=True)
    (docs / "eval" / "results" / "notes" / "a.md").write_text("# A note\n")
    build.write_listings(docs)
    assert "[A note](a.md)" in (docs / "eval/results/notes/index.md").read_text()
    guide = docs / "eval" / "README.md"
    guide.write_text("[notes](results/notes/) [results](results/notes/a.md) [x](https://a/b/)\n")
    build.point_folder_links(docs, guide)
    assert guide.read_text() == ("[notes](results/notes/index.md) [results](results/notes/a.md) "
                                 "[x](https://a/b/)\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    _needs_mkdocs()
    out = tmp_path_factory.mktemp("site")
    done = build.build(out)
    return out, done


def test_the_site_builds_strictly_from_the_checkout(site):
    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    for page in ("index.html", "eval/index.html", "reference/commands.html",
                 "compatibility.html", "eval/results/index.html", "serve/client_example.py"):
        assert (out / page).is_file(), page
    assert "draftkit distill" in (out / "reference" / "commands.html").read_text()


# --- in a browser -------------------------------------------------------------------------------

# added to each page the test server sends: once the page has loaded, every plot's state
PROBE = b"""<script>addEventListener("load", () => document.body.setAttribute("data-plots",
JSON.stringify([...document.images].filter(i => i.src.endsWith(".png"))
  .map(i => [i.getAttribute("src"), i.complete && i.naturalWidth > 0]))));</script></body>"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    served: list = []

    def send_head(self):
        path = Path(self.translate_path(self.path))
        if path.suffix != ".html":
            head = super().send_head()
            self.served.append((self.path, 200 if head else 404))
            return head
        body = path.read_bytes().replace(b"</body>", PROBE)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, *args):
        pass


def _render(browser: str, url: str) -> str:
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=10000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120).stdout


@pytest.mark.slow
def test_a_browser_renders_the_home_page_and_a_guide_with_their_plots(site):
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip(f"no headless browser ({', '.join(BROWSERS)}); CI installs chromium")
    out, done = site
    assert done.returncode == 0, done.stderr[-3000:]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             partial(_Handler, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for page, texts, plots in [
                ("index.html", ["The two commands", "What the quickstart prints"], 1),
                ("eval/index.html", ["Evaluating a draft", "What each report figure means"], 5)]:
            dom = _render(browser, f"{base}/{page}")
            for text in texts:
                assert text in dom, f"{page}: no '{text}' in what the browser rendered"
            marker = 'data-plots="'
            assert marker in dom, f"{page}: the page did not finish loading"
            shown = json.loads(dom.split(marker, 1)[1].split('"', 1)[0].replace("&quot;", '"'))
            assert len(shown) >= plots, shown
            assert all(loaded for _, loaded in shown), \
                f"{page}: plots not shown: {[src for src, loaded in shown if not loaded]}"
        pngs = [(path, status) for path, status in _Handler.served if path.endswith(".png")]
        assert pngs and all(status == 200 for _, status in pngs), pngs
    finally:
        server.shutdown()
