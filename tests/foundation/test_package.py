"""The habits of a kept project: the licence file is the licence declared, the changelog's
newest release is the version the package says, and the package says it is typed."""

import re
import tomllib
from pathlib import Path

import draftkit

ROOT = Path(__file__).resolve().parents[2]


def test_the_license_file_is_the_declared_license():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    text = (ROOT / "LICENSE").read_text()
    assert declared == "Apache-2.0"
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_changelogs_newest_release_is_the_packages_version():
    releases = re.findall(r"(?m)^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text())
    assert releases and releases[0] == draftkit.__version__
    assert (Path(draftkit.__file__).parent / "py.typed").is_file()
