"""The signing and trust flags the commands share, ``draftkit keygen``'s, and what
``--trusted-key`` sets for the process, declared once and light to import: every command's
``--help`` reads them (the signing itself, with ``model-signing``, is :mod:`draftkit.signing`).

- :class:`SigningArgs`: how export, refresh and the quickstart sign the bundle they write;
- :class:`TrustArgs`: whose bundles a command takes (:func:`set_trusted` applies it);
- :class:`KeygenArgs`: ``draftkit keygen DIR``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from draftkit.bundle_signature import TRUST_ENV, SignatureError, read_trust
from draftkit.config import option
from draftkit.errors import ConfigError

KEY_ENV = "DRAFTKIT_SIGNING_KEY"  # the private key export and refresh sign with
CERTIFICATE_ENV = "DRAFTKIT_SIGNING_CERTIFICATE"  # its certificate, where a PKI issued one
CHAIN_ENV = "DRAFTKIT_CERTIFICATE_CHAIN"  # the certificates between it and the root
SIGN, TRUST = "signing the bundle", "trusted signers"  # the flags' --help groups


@dataclass(kw_only=True)
class SigningArgs:
    """How export and refresh sign the bundle they write (:func:`draftkit.signing.signer_of`
    reads them)."""

    signing_key: str | None = option(None, group=SIGN, metavar="PEM", help=(
        f"private key (PEM, elliptic curve) that signs the bundle (default: ${KEY_ENV}; "
        f"`draftkit keygen DIR` makes one)"))
    signing_certificate: str | None = option(None, group=SIGN, metavar="PEM", help=(
        f"the key's certificate, where a team's PKI issues one (default: "
        f"${CERTIFICATE_ENV})"))
    certificate_chain: list[str] = option([], group=SIGN, metavar="PEM,...", help=(
        f"the certificates between it and the root (default: ${CHAIN_ENV}, "
        f"'{os.pathsep}'-separated)"))
    unsigned: bool = option(False, group=SIGN, help=(
        "write the bundle unsigned: its manifest and `draftkit check` say so, and a process "
        "that trusts keys refuses it"))


@dataclass(kw_only=True)
class TrustArgs:
    """Whose bundles a command takes."""

    trusted_key: list[str] = option([], group=TRUST, metavar="PEM,...", help=(
        f"take only bundles signed by these public keys (PEM files, or folders of .pem/.pub "
        f"files; CA certificates for certificate-signed bundles) (default: ${TRUST_ENV}; "
        f"none: a bundle's signature is checked against the key it names)"))


@dataclass(kw_only=True)
class KeygenArgs:
    """Make an elliptic-curve (P-256) key pair to sign bundles with: DIR/draftkit.key, the
    private key (mode 0600: keep it where only the signer reads it), and DIR/draftkit.pub, the
    public key the serving side trusts (--trusted-key)."""

    folder: str = option(help="folder to write the pair into", positional=True)


def set_trusted(paths: list[str] | None) -> None:
    """Trust the public keys and CA certificates in ``paths`` (files, or folders of .pem,
    .pub and .crt files) in this process and those it starts; None or empty leaves the
    setting (``DRAFTKIT_TRUSTED_KEYS``) as it is. Each path is read here, so a wrong one is
    named before any work."""
    if not paths:
        return
    value = os.pathsep.join(str(Path(p).expanduser().resolve()) for p in paths)
    try:
        read_trust(value)
    except SignatureError as e:
        raise ConfigError(str(e)) from None
    os.environ[TRUST_ENV] = value
