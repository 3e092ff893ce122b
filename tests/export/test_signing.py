"""Who made a bundle (issue 65): export signs with model-signing, every door verifies, and a
trusted key refuses a bundle resealed by anyone else; the bundle's own launcher runs the checks
``check`` runs. The tests' bundles are signed by the session key (tests/conftest.py)."""

import datetime
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from draftkit.bundle_signature import TRUST_ENV
from draftkit.errors import ConfigError, ModelError
from draftkit.export import check_bundle, export_bundle
from draftkit.manifest import read_manifest
from draftkit.signing import KEY_ENV, Signer, key_id
from draftkit.signing_args import set_trusted
from tests.export.test_eagle3 import _saved
from tests.export.test_integrity import _edit_config, _refused
from tests.helpers import forge, reseal, write_manifest


@pytest.fixture
def trust():
    """set_trusted (undone after each test: tests/conftest.py)."""
    return set_trusted


def _session_public() -> Path:
    return Path(os.environ[KEY_ENV]).with_name("draftkit.pub")


def _shift_layers(out: Path) -> None:
    """The forgery the probe found: the head's tapped layers shifted (both places its config
    states them), then made consistent and signed by a forger (tests.helpers.forge)."""
    config = json.loads((out / "draft" / "config.json").read_text())
    _edit_config(out / "draft", eagle_aux_hidden_state_layer_ids=[1, 3, 4],
                 eagle_config={**config["eagle_config"],
                               "eagle_aux_hidden_state_layer_ids": [0, 2, 3]})
    manifest = json.loads((out / "draftkit.json").read_text())
    manifest["draft"]["eagle_aux_hidden_state_layer_ids"] = [1, 3, 4]
    (out / "draftkit.json").write_text(json.dumps(manifest))


def _sha(path: Path) -> str:
    from draftkit.io import sha256_file
    return sha256_file(path)


def test_export_signs_and_check_says_by_whom(bundle, trust, capsys):
    out, target = bundle
    manifest = read_manifest(out)
    public = _session_public()
    assert manifest.signing.method == "key"
    assert manifest.signing.key_id == key_id(public.read_bytes())
    assert (out / "draftkit.sig").is_file() and "draftkit.sig" not in manifest.files
    from draftkit.cli import main
    assert main(["check", str(out), "--target", str(target)]) == 0
    assert "not checked against a trusted key: pass --trusted-key" in capsys.readouterr().out
    assert main(["check", str(out), "--target", str(target), "--trusted-key", str(public)]) == 0
    assert f"signed by trusted key {manifest.signing.key_id[:16]}" in capsys.readouterr().out


def test_a_resealed_forgery_is_refused_by_a_trusted_key(bundle, tmp_path, trust, capsys):
    out, target = bundle
    _shift_layers(out)
    forge(out, tmp_path / "forger")
    check_bundle(out, target=str(target))  # consistent and self-signed: integrity holds ...
    _refused(capsys, ["check", str(out), "--target", str(target), "--trusted-key",
                      str(_session_public())], "which no trusted key matches")  # ... not trust
    _refused(capsys, ["generate", "--target", str(target), "--draft", str(out), "--prompt", "hi",
                      "--max-new-tokens", "1", "--k", "2", "--trusted-key",
                      str(_session_public().parent)], "which no trusted key matches")


def test_a_resealed_edit_without_the_key_fails_the_signature(bundle, capsys):
    out, target = bundle
    manifest = json.loads((out / "draftkit.json").read_text())
    manifest["domains"] = {"chat": {**{k: None for k in ("alpha", "tau", "c", "k",
                                                          "speedup_measured",
                                                          "speedup_predicted", "verdict")}}}
    manifest["measured"] = True
    from tests.helpers import write_manifest as reseal
    signature = (out / "draftkit.sig").read_bytes()
    reseal(out, manifest)
    (out / "draftkit.sig").write_bytes(signature)  # the old signature: no key to sign anew
    _refused(capsys, ["check", str(out)], "fails its signature (draftkit.json differs from the "
                                          "signed file)")
    (out / "draftkit.sig").unlink()
    _refused(capsys, ["check", str(out)], "records a signature but has no draftkit.sig")


def test_unsigned_only_when_asked_and_said(tmp_path, trust, monkeypatch, capsys):
    _, target_dir, head_dir = _saved(tmp_path)
    public = _session_public()
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ConfigError, match="a bundle is signed: pass --signing-key PEM"):
        export_bundle(str(target_dir), str(head_dir), tmp_path / "b", k=2)
    assert not (tmp_path / "b").exists()
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "b", k=2, signer=None)
    assert read_manifest(out).signing.method == "none" and not (out / "draftkit.sig").exists()
    from draftkit.cli import main
    assert main(["check", str(out)]) == 0
    assert "unsigned (exported with --unsigned)" in capsys.readouterr().out
    _refused(capsys, ["check", str(out), "--trusted-key", str(public)],
             "is unsigned (exported with --unsigned) and this process trusts only signed")


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path, capsys):
    from draftkit.cli import main
    assert main(["keygen", str(tmp_path / "keys")]) == 0
    private = tmp_path / "keys" / "draftkit.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert "--trusted-key" in capsys.readouterr().out
    _refused(capsys, ["keygen", str(tmp_path / "keys")], "exists; keep it")
    with pytest.raises(ConfigError, match="does not read as an unencrypted PEM private key"):
        Signer(tmp_path / "keys" / "draftkit.pub").public_pem()
    with pytest.raises(ConfigError, match="is not a PEM file or a folder holding them"):
        set_trusted([str(tmp_path / "nowhere.pub")])


def _ca(tmp: Path, name: str):
    """A CA certificate, and a signing key with a certificate it issued."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def cert(subject, issuer, key, signer, ca):
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=30))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), True)
                   .add_extension(x509.KeyUsage(not ca, False, False, False, False, ca, ca,
                                                False, False), True))
        if ca:
            builder = builder.add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        return builder.sign(signer, hashes.SHA256())

    tmp.mkdir(parents=True)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    leaf_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} signer")])
    ca_cert = cert(ca_name, ca_name, ca_key, ca_key, True)
    leaf = cert(leaf_name, ca_name, key, ca_key, False)
    pem = serialization.Encoding.PEM
    (tmp / "ca.crt").write_bytes(ca_cert.public_bytes(pem))
    (tmp / "signer.crt").write_bytes(leaf.public_bytes(pem))
    (tmp / "signer.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return tmp / "ca.crt", Signer(tmp / "signer.key", tmp / "signer.crt", (tmp / "ca.crt",))


def test_a_certificate_signed_bundle_chains_to_a_trusted_ca(tmp_path, trust):
    _, target_dir, head_dir = _saved(tmp_path)
    ca, signer = _ca(tmp_path / "team", "team")
    other_ca, _ = _ca(tmp_path / "other", "other")
    out = export_bundle(str(target_dir), str(head_dir), tmp_path / "b", k=2, signer=signer)
    assert read_manifest(out).signing.method == "certificate"
    check_bundle(out, check_target=False)  # by the key it names
    trust([str(ca)])
    check_bundle(out, check_target=False)
    trust([str(other_ca)])
    with pytest.raises(ModelError, match="fails its signature"):
        check_bundle(out, check_target=False)


def test_the_launcher_runs_the_checks_check_runs(bundle):
    """A resealed (and re-signed) manifest whose serving K disagrees with its top-level K, and
    one whose serving target is a folder that is not there, stop serving/preflight.py."""
    out, _ = bundle
    preflight = [sys.executable, str(out / "serving" / "preflight.py"), "vllm", "0.34.0"]
    manifest = json.loads((out / "draftkit.json").read_text())
    manifest["serving"]["num_speculative_tokens"] = 3
    write_manifest(out, manifest)
    ran = subprocess.run(preflight, capture_output=True, text=True)
    assert ran.returncode == 1 and ran.stdout == "" and "Traceback" not in ran.stderr
    assert "num_speculative_tokens is 2 but serving.num_speculative_tokens is 3" in ran.stderr
    manifest["serving"]["num_speculative_tokens"] = 2
    manifest["serving"]["target"] = manifest["target"]["path"] = "/nowhere/target"
    config = json.loads((out / "draft" / "config.json").read_text())
    config["speculators_config"]["verifier"]["name_or_path"] = "/nowhere/target"
    (out / "draft" / "config.json").write_text(json.dumps(config))  # `vllm serve draft/`'s
    write_manifest(out, manifest)
    reseal(out)
    ran = subprocess.run(preflight, capture_output=True, text=True)
    assert ran.returncode == 1 and ran.stdout == ""
    assert "/nowhere/target, is not a folder here; pass --target" in ran.stderr


def test_check_tells_a_moved_bundle_from_a_vllm_json_naming_another_head(bundle, tmp_path,
                                                                          capsys):
    """serving/vllm.json names the head by path: a folder with this bundle's draft files is a
    move (or a copy), one with other files is an edit, whatever the folder is called."""
    out, target = bundle
    from draftkit.cli import main
    assert main(["check", str(out), "--target", str(target)]) == 0
    assert "note: the bundle has moved" in capsys.readouterr().out  # a copy of the fixture's
    other = tmp_path / "elsewhere" / "draft"
    other.mkdir(parents=True)
    (other / "config.json").write_text("{}")
    spec = json.loads((out / "serving" / "vllm.json").read_text())
    (out / "serving" / "vllm.json").write_text(json.dumps({**spec, "model": str(other)}))
    manifest = json.loads((out / "draftkit.json").read_text())
    manifest["files"]["serving/vllm.json"] = _sha(out / "serving" / "vllm.json")
    write_manifest(out, manifest)
    _refused(capsys, ["check", str(out)], "whose files are not this bundle's draft/")


def test_the_launcher_checks_the_signature_with_the_keys_trusted(bundle, tmp_path):
    out, _ = bundle
    preflight = [sys.executable, str(out / "serving" / "preflight.py"), "vllm", "0.34.0"]
    env = {**os.environ, TRUST_ENV: str(_session_public())}
    ran = subprocess.run(preflight, capture_output=True, text=True, env=env)
    assert ran.returncode == 0 and "--speculative-config" in ran.stdout, ran.stderr
    forge(out, tmp_path / "forger")
    ran = subprocess.run(preflight, capture_output=True, text=True, env=env)
    assert ran.returncode == 1 and ran.stdout == "" and "Traceback" not in ran.stderr
    assert "which no trusted key matches" in ran.stderr
    assert not (out / "serving" / "__pycache__").exists()  # nothing written into the bundle
