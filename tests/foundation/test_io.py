"""Reading JSON and JSONL: every bad file is one clear error naming the path (and line)."""

import json

import pytest

from draftkit.errors import ConfigError, DraftkitError, ModelError
from draftkit.io import read_json, read_jsonl


def test_read_json_names_what_is_wrong_and_what_to_do(tmp_path):
    good = tmp_path / "good.json"
    good.write_bytes(b"\xef\xbb\xbf" + json.dumps({"a": 1}).encode())  # an editor's BOM
    assert read_json(good, "config", "fix it") == {"a": 1}
    cases = [(tmp_path / "missing.json", None, "config .*missing.json does not exist; fix it"),
             (tmp_path, None, "is a folder; fix it"),
             (tmp_path / "latin.json", b'{"a":\n "\xe9"}', r"latin.json:2: not UTF-8 text "
                                                           r"\(byte 0xe9\); fix it"),
             (tmp_path / "bad.json", b'{"a": 1,\n}', r"bad.json is not valid JSON \(line 2"),
             (tmp_path / "list.json", b"[1]", "list.json is not a JSON object; fix it")]
    for path, data, message in cases:
        if data is not None:
            path.write_bytes(data)
        with pytest.raises(ConfigError, match=message):
            read_json(path, "config", "fix it", ConfigError)
    assert read_json(tmp_path / "list.json", "x", "y", kind=object) == [1]


def test_read_jsonl_names_each_line_and_keeps_json_line_separators(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"p": "a\u2028b"}\n\n"two"\r\n', encoding="utf-8")
    assert read_jsonl(path, "rows", "fix") == [(f"{path}:1", {"p": "a\u2028b"}),
                                                (f"{path}:3", "two")]
    path.write_text('"one"\n{"p": \n')
    with pytest.raises(DraftkitError, match=r"rows.jsonl:2: invalid JSON .*; fix"):
        read_jsonl(path, "rows", "fix")


def test_files_that_crashed_commands_are_one_line_each(tmp_path):
    """A bundle manifest or a prompts file that is not UTF-8, and a manifest whose target is
    not a mapping, once gave tracebacks."""
    from draftkit.chat import read_prompts
    from draftkit.export.bundle import check_bundle
    from draftkit.models.resolve import resolve_model

    bundle = tmp_path / "bundle"
    (bundle / "draft").mkdir(parents=True)
    (bundle / "draftkit.json").write_bytes(b'{"target": "\xff"}')
    for call in (lambda: check_bundle(bundle), lambda: resolve_model(str(bundle), "target")):
        with pytest.raises(ModelError, match=r"draftkit.json:1: not UTF-8 text"):
            call()
    (bundle / "draftkit.json").write_text(json.dumps({"target": "somewhere"}))
    with pytest.raises(ModelError, match="target is 'somewhere', not a mapping; re-export"):
        resolve_model(str(bundle), "target")
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(b'"caf\xe9"\n')
    with pytest.raises(DraftkitError, match=r"p.jsonl:1: not UTF-8 text .*pass a JSONL file"):
        read_prompts(prompts)


def test_a_report_that_is_not_utf8_is_one_line_and_writes_nothing(tiny_dirs, tmp_path):
    from draftkit.export.bundle import export_bundle

    report = tmp_path / "report.json"
    report.write_bytes(b'{"overall": "\xe9"}')
    with pytest.raises(DraftkitError, match=r"report.json:1: not UTF-8 text .*draftkit eval"):
        export_bundle(str(tiny_dirs[0]), str(tiny_dirs[1]), tmp_path / "b", report=report)
    assert not (tmp_path / "b").exists()


def test_an_unwritable_out_is_named_as_given_not_by_its_temporary_folder(tiny_dirs, tmp_path,
                                                                          monkeypatch, capsys):
    """export writes into a hidden temporary folder beside --out; when that cannot be made, the
    message names --out. check on a path that does not exist says so."""
    import tempfile

    from draftkit.cli import main

    target_dir, draft_dir = tiny_dirs
    out = tmp_path / "locked" / "bundle"

    def refuse(prefix, suffix, dir):
        raise PermissionError(13, "Permission denied", f"{dir}/{prefix}x1y2{suffix}")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    assert main(["export", "--target", str(target_dir), "--draft", str(draft_dir),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"cannot use {out} (Permission denied)" in err and ".tmp" not in err
    monkeypatch.undo()
    assert main(["check", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist; pass the folder `draftkit export` wrote" in \
        capsys.readouterr().err
