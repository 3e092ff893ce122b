"""Who signed a bundle: its signature (``draftkit.sig``, written by the OpenSSF
``model-signing`` library) verified with that library, against the keys the process trusts
(``DRAFTKIT_TRUSTED_KEYS``), or, where none are set, against the key the manifest names. One
implementation that ``draftkit`` (:mod:`draftkit.signing`) and a bundle's own
``serving/preflight.py`` (a copy of this file beside it) run; the standard library at import,
model-signing and cryptography where a signature is checked (a serving machine without them
is told so).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

TRUST_ENV = "DRAFTKIT_TRUSTED_KEYS"  # trusted public keys / CA certificates (files or folders)
UNSIGNED = "none"
_PEM_SUFFIXES = (".pem", ".pub", ".crt")


class SignatureError(Exception):
    """Why a bundle's signature, or a trusted key, is refused, in one line."""


class NotInstalled(SignatureError):
    """The bundle is signed and model-signing, which checks it, is not installed here."""


def key_id(public_pem: bytes) -> str:
    """A public key's identity: sha256 of its PEM (SubjectPublicKeyInfo), as model-signing
    writes it into a signature's verification material."""
    return hashlib.sha256(public_pem).hexdigest()


# --- trust ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Trust:
    """Trusted public keys (by :func:`key_id`) and CA certificate files."""

    keys: dict[str, Path]
    certificates: tuple[Path, ...]


def trusted() -> Trust | None:
    """The keys this process trusts (``DRAFTKIT_TRUSTED_KEYS``); None where none is set."""
    value = os.environ.get(TRUST_ENV, "")
    return read_trust(value) if value.strip() else None


def read_trust(value: str) -> Trust:
    """The keys and CA certificates in ``value``: paths (files, or folders of .pem, .pub and
    .crt files) separated by the OS path separator."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    keys, certificates = {}, []
    for part in (p for p in value.split(os.pathsep) if p):
        path = Path(part)
        files = sorted(f for f in path.iterdir() if f.suffix in _PEM_SUFFIXES) \
            if path.is_dir() else [path]
        if not path.exists() or not files:
            raise SignatureError(f"trusted key {part} is not a PEM file or a folder holding "
                                 f"them (.pem, .pub, .crt); pass the signer's public key")
        for file in files:
            data = file.read_bytes()
            if b"BEGIN CERTIFICATE" in data:
                x509.load_pem_x509_certificates(data)  # named below when it does not read
                certificates.append(file)
                continue
            try:
                public = serialization.load_pem_public_key(data)
            except ValueError:
                raise SignatureError(f"trusted key {file} is not a PEM public key or "
                                     f"certificate; pass the signer's draftkit.pub") from None
            pem = public.public_bytes(serialization.Encoding.PEM,
                                      serialization.PublicFormat.SubjectPublicKeyInfo)
            keys[key_id(pem)] = file
    return Trust(keys, tuple(certificates))


# --- verifying ------------------------------------------------------------------------------------

def verify(root: Path, signature: Path, entry: dict | None) -> str:
    """Check the bundle at ``root`` against ``signature`` with model-signing, as the process's
    trust setting asks (see the module's docstring); ``entry`` is the manifest's ``signing``
    entry. What was found, in words, or one SignatureError line saying why the bundle is
    refused."""
    trust = trusted()
    if entry is None or entry["method"] == UNSIGNED:
        how = "exported with --unsigned" if entry is not None else "exported before signing"
        if trust is not None:
            raise SignatureError(f"{root} is unsigned ({how}) and this process trusts only "
                                 f"signed bundles ({TRUST_ENV}); re-export it with "
                                 f"--signing-key")
        return f"unsigned ({how})"
    if not signature.is_file():
        raise SignatureError(f"{root} records a signature but has no {signature.name} (removed "
                             f"or not copied); copy the whole bundle, or re-export it")
    short = entry["key_id"][:16]
    if trust is None:
        _check(root, signature, entry)
        return f"signed by key {short} (not checked against a trusted key: pass --trusted-key)"
    if entry["method"] == "certificate" and trust.certificates:
        _check(root, signature, entry, chain=trust.certificates)
        return f"signed by certificate key {short}, which chains to a trusted certificate"
    if entry["key_id"] not in trust.keys:
        raise SignatureError(f"{root} is signed by key {short}, which no trusted key matches; "
                             f"pass the signer's public key with --trusted-key, or refuse the "
                             f"bundle")
    known = trust.keys[entry["key_id"]]
    _check(root, signature, entry, public_key=known.read_bytes())
    return f"signed by trusted key {short} ({known.name})"


def _check(root: Path, signature: Path, entry: dict, *, public_key: bytes | None = None,
           chain: tuple[Path, ...] = ()) -> None:
    """model-signing's verification of ``root`` against ``signature``: a key signature with
    ``public_key`` (default: the one the manifest records), a certificate signature against
    ``chain`` (default: the certificates it carries, its leaf's key the one the manifest
    records); one SignatureError line where it fails."""
    try:
        from model_signing import verifying
    except ImportError:
        raise NotInstalled(f"{root} is signed, and model-signing, which checks signatures, is "
                           f"not installed here; pip install model-signing") from None
    config = verifying.Config()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if entry["method"] == "certificate":
                config.use_certificate_verifier(
                    certificate_chain=chain or _carried_chain(signature, entry, Path(tmp)))
            else:
                path = Path(tmp) / "key.pub"
                path.write_bytes(public_key or entry["public_key"].encode())
                config.use_elliptic_key_verifier(public_key=path)
            config.verify(root, signature)
    except SignatureError:
        raise
    except Exception as e:  # the library raises ValueError, cryptography's and OpenSSL's own
        raise SignatureError(f"{root} fails its signature ({_reason(e)}): edited after it was "
                             f"signed, or signed by another key; refuse it, or re-export "
                             f"it") from None


def _carried_chain(signature: Path, entry: dict, tmp: Path) -> list[Path]:
    """The certificates a certificate signature carries, as PEM files in ``tmp``, its signing
    certificate's key checked to be the one the manifest records."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    material = json.loads(signature.read_text()).get("verificationMaterial", {})
    raw = material.get("x509CertificateChain", {}).get("certificates", [])
    certificates = [x509.load_der_x509_certificate(base64.b64decode(c["rawBytes"])) for c in raw]
    if not certificates or key_id(certificates[0].public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)) != \
            entry["key_id"]:
        raise SignatureError(f"{signature} is not signed by the certificate key the manifest "
                             f"records; refuse the bundle, or re-export it")
    path = tmp / "chain.pem"
    path.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates))
    return [path]


def _reason(e: Exception) -> str:
    """The library's message in a few words: which file differs, or that the key does not
    match (never the digests)."""
    text = str(e)
    for pattern, say in ((r"Hash mismatch for \\?'([^'\\]+)", "{} differs from the signed file"),
                         (r"Extra files found in model '[^']*': (\S+)", "{} was not signed"),
                         (r"Missing files in model '[^']*': (\S+)", "{} is missing"),
                         (r"Key mismatch", "the key does not match")):
        found = re.search(pattern, text)
        if found:
            return say.format(*(f.strip("[]',\"") for f in found.groups()))
    return (text.splitlines()[0] if text else type(e).__name__)[:120]
