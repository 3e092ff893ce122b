"""A command whose optional part is not installed stops in one line naming the extra."""

from draftkit import extras
from draftkit.cli import main


def test_a_missing_extra_is_named_with_what_installs_it(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(extras.EXTRAS, "serve", ("fastapi", "no_such_module_for_draftkit"))
    assert main(["serve", "--target", str(tmp_path), "--k", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("draftkit serve: error: draftkit serve needs no_such_module_for_draftkit, "
                   "from draftkit's 'serve' extra, which is not installed: pip install "
                   "'draftkit-spec[serve]'")
    assert extras.missing(("json", "no_such_module_for_draftkit")) == \
        ["no_such_module_for_draftkit"]
