"""draftkit.json is one typed record: written from it, read back into it byte for byte, a key no
field names refused by its dotted name; export's --k is a number or 'report', never 'auto'."""

import json
import typing
from pathlib import Path

import pytest

from draftkit.errors import ConfigError, DraftkitError, ModelError
from draftkit.figures import EvalReport
from draftkit.export import check_bundle, export_bundle
from draftkit.manifest import NAME, DomainEntry, Manifest, read_manifest, write_manifest
from tests.helpers import write_manifest as reseal

REPORT = Path(__file__).parents[1] / "evaluate" / "reports" / "eval.json"
RECIPE = next((Path(__file__).parents[2] / "recipes").rglob("quickstart_ttt.yaml"))


@pytest.fixture
def bundle(tiny_dirs, tmp_path):
    target_dir, draft_dir = tiny_dirs
    return export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", report=REPORT,
                         recipe=RECIPE)


def test_the_manifest_round_trips_through_its_record(bundle, tmp_path):
    written = (bundle / NAME).read_bytes()
    manifest = read_manifest(bundle)
    assert isinstance(manifest, Manifest) and manifest.serving.k_per_batch_size
    assert manifest.manifest_sha256 is not None and manifest.recipe.path == str(RECIPE)
    raw = json.loads(written)
    assert manifest.domains["code"] == DomainEntry(**{k: raw["domains"]["code"][k] for k in (
        "alpha", "tau", "c", "k", "speedup_measured", "speedup_predicted", "verdict")})
    again = tmp_path / "again"
    again.mkdir()
    assert write_manifest(again, manifest) == manifest  # sealed again to the same hash
    assert (again / NAME).read_bytes() == written
    assert read_manifest(again) == manifest == Manifest.from_dict(raw)

    # a bundle from before some later fields: it reads, and writes back as it was
    for pop in (lambda m: m.pop("serving"), lambda m: m["draft"].pop("dtype"),
                lambda m: m["serving"]["engines"]["vllm"].pop("sampled_broken")):
        older = json.loads(written)
        pop(older)
        older.pop("manifest_sha256")
        reseal(again, older)
        text = (again / NAME).read_bytes()
        write_manifest(again, read_manifest(again))
        assert (again / NAME).read_bytes() == text


def test_a_key_no_field_names_is_refused_by_its_name(bundle, tmp_path):
    sealed = json.loads((bundle / NAME).read_text())
    cases = [  # (edit, the field the one line names)
        (lambda m: m.update(speedup=2.0), "speedup"),
        (lambda m: m["draft"].update(quantized=True), "draft.quantized"),
        (lambda m: m["domains"]["code"].update(alpha_typo=0.9), "domains.code.alpha_typo"),
        (lambda m: m["serving"]["engines"]["vllm"].update(tp=2), "serving.engines.vllm.tp"),
        (lambda m: m["report"].update(seed=0), "report.seed"),
    ]
    for edit, field in cases:
        for resealed in (True, False):  # as a faulty exporter sealed it, or edited by hand
            manifest = json.loads(json.dumps(sealed))
            edit(manifest)
            if resealed:
                manifest.pop("manifest_sha256")
                reseal(bundle, manifest)
            else:
                (bundle / NAME).write_text(json.dumps(manifest, indent=2))
            with pytest.raises(ModelError) as caught:
                read_manifest(bundle)
            line = str(caught.value)
            assert f"draftkit.json: {field} is not a field of a draftkit bundle manifest" in line
            assert "\n" not in line and "re-export the bundle" in line
    manifest = json.loads(json.dumps(sealed))
    manifest["report"] = 5
    manifest.pop("manifest_sha256")
    reseal(bundle, manifest)
    with pytest.raises(ModelError, match=r"draftkit.json: report is 5, not a mapping"):
        read_manifest(bundle)


def test_export_takes_the_reports_k_by_name_and_refuses_auto(tiny_dirs, tmp_path, capsys):
    from draftkit.cli import main

    target_dir, draft_dir = tiny_dirs
    args = ["export", "--target", str(target_dir), "--draft", str(draft_dir), "--report",
            str(REPORT), "--out"]
    assert main([*args, str(tmp_path / "r"), "--k", "report"]) == 0
    manifest = check_bundle(tmp_path / "r")
    assert manifest.k_source == "report"
    assert manifest.num_speculative_tokens == json.loads(REPORT.read_text())["overall"]["k"]
    capsys.readouterr()
    assert main([*args, str(tmp_path / "a"), "--k", "auto"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--k auto is not a K a bundle can record" in err
    assert "--k report" in err and not (tmp_path / "a").exists()
    assert main([*args, str(tmp_path / "x"), "--k", "most"]) == 2
    assert "an integer >= 0 or 'report'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--k auto is not a K a bundle can record"):
        export_bundle(str(target_dir), str(draft_dir), tmp_path / "a", k="auto")
    with pytest.raises(DraftkitError):
        export_bundle(str(target_dir), str(draft_dir), tmp_path / "a", k=-1)


def test_a_report_handed_over_as_a_record_is_recorded_as_from_its_file(tiny_dirs, tmp_path):
    """The quickstart hands export its EvalReport; the manifest is the one its report.json
    gives."""
    target_dir, draft_dir = tiny_dirs
    record = EvalReport.from_dict(json.loads(REPORT.read_text()))
    manifests = []
    for report in (REPORT, record):
        out = export_bundle(str(target_dir), str(draft_dir), tmp_path / "b", report=report,
                            force=True)
        manifest = json.loads((out / NAME).read_text())
        manifests.append({k: v for k, v in manifest.items()
                          if k not in ("created", "manifest_sha256")})
    assert manifests[0] == manifests[1] and manifests[0]["k_source"] == "report"


# --- the ranges: on the record's fields, and in bundle_checks for a launcher without draftkit ---

def _bounded(cls, prefix: str = ""):
    """(dotted field, values out of its range or choices) for each field of the manifest's
    records whose type carries a Range or a OneOf (a domain's under domains.code)."""
    from draftkit.fields import OneOf, Range, hints, parts
    from draftkit.records import Record

    for name, tp in hints(cls).items():
        inner, _, marks = parts(tp)
        item = typing.get_args(inner)[-1] if typing.get_origin(inner) in (list, dict) else None
        if isinstance(inner, type) and issubclass(inner, Record):
            yield from _bounded(inner, f"{prefix}{name}.")
        elif isinstance(item, type) and issubclass(item, Record):
            yield from _bounded(item, f"{prefix}{name}.code.")
        for mark in marks + (parts(item)[2] if typing.get_origin(inner) is list else ()):
            bad = [mark.low - 1 if mark.low is not None else None, mark.above,
                   mark.high + 1 if mark.high is not None else None, mark.below] \
                if isinstance(mark, Range) else ["int8"] if isinstance(mark, OneOf) else []
            bad = [[1, v] if typing.get_origin(inner) is list else v for v in bad
                   if v is not None]
            yield prefix + name, bad


def test_every_range_a_field_carries_is_the_one_bundle_checks_states():
    """The bundle's launcher checks a manifest with bundle_checks (standard library only, and
    hashed into every bundle); the record's fields carry the same ranges, so a value out of one
    is refused by both, naming the same field."""
    from draftkit import bundle_checks
    from draftkit.manifest import check_fields

    base = {"target": {}, "draft": {}, "files": {}, "num_speculative_tokens": 1,
            "domains": {"code": {"alpha": 0.5, "tau": 2.0, "c": 0.1, "k": 2,
                                 "speedup_measured": 1.2, "speedup_predicted": 1.3}},
            "break_even_batch": 4,
            "serving": {"target": "t", "dtype": "bfloat16", "tp_sizes": [1, 2],
                        "num_speculative_tokens": 1, "k_per_batch_size": None,
                        "engines": {"vllm": {}, "sglang": {}}}}
    bundle_checks.check_values(base, NAME)
    check_fields(base, NAME)
    bounded = dict(_bounded(Manifest))
    assert {"num_speculative_tokens", "break_even_batch", "domains.code.alpha",
            "domains.code.tau", "domains.code.c", "domains.code.k", "serving.dtype",
            "serving.tp_sizes", "serving.num_speculative_tokens"} <= set(bounded)
    for name, values in bounded.items():
        assert values, name
        for value in values:
            manifest = json.loads(json.dumps(base))
            *path, last = name.split(".")
            node = manifest
            for part in path:
                node = node[part]
            node[last] = value
            with pytest.raises(bundle_checks.BundleError, match=rf"^{NAME}: {name} is "):
                bundle_checks.check_values(manifest, NAME)
            with pytest.raises(ModelError) as e:
                check_fields(manifest, NAME)
            assert str(e.value).startswith(f"{NAME}: {name} is ")  # a list's item: the item
            assert str(e.value).endswith("re-export the bundle with `draftkit export`")
