"""Who made a bundle: signatures with the OpenSSF ``model-signing`` library, and the keys a
process trusts.

The manifest's hashes (:mod:`draftkit.manifest`) prove a bundle unchanged since it was sealed,
not who sealed it: anyone who edits a bundle can reseal it. So export signs the whole folder
with ``model-signing`` (a Sigstore bundle, ``draftkit.sig``, beside ``draftkit.json``: a
sha256 of every file, signed), with an elliptic-curve private key (:class:`Signer`), or a
key and its certificate where a team's PKI issues them. The manifest's ``signing`` entry
records how (:class:`~draftkit.manifest.SigningEntry`), and the signer's public key, so a bundle
checks against itself anywhere; "none" only where export was asked for an unsigned bundle.

Every door that loads a bundle calls :func:`verify`. Without trusted keys it checks the
signature against the key the bundle names, which catches any edit but not a forger who signs
with a key of their own; with trusted keys (:func:`~draftkit.signing_args.set_trusted`:
``--trusted-key`` or ``DRAFTKIT_TRUSTED_KEYS``; public keys, or CA certificates for
certificate-signed bundles) a bundle signed by no trusted key, or unsigned, is refused. The
setting is kept in the process's environment, so the processes a command starts (a server's
replicas) trust the same keys. The flags are :mod:`draftkit.signing_args`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from model_signing import hashing, signing

from draftkit import bundle_signature as signature
from draftkit.bundle_checks import SIGNATURE
from draftkit.bundle_signature import SignatureError, key_id
from draftkit.errors import ConfigError, ModelError
from draftkit.manifest import SigningEntry
from draftkit.signing_args import CERTIFICATE_ENV, CHAIN_ENV, KEY_ENV, KeygenArgs, SigningArgs


def keygen(args: KeygenArgs) -> tuple[Path, Path]:
    """``draftkit keygen DIR``."""
    private, public = new_key_pair(args.folder)
    print(f"wrote {private} (private: sign with --signing-key {private}, or set {KEY_ENV})")
    print(f"wrote {public} (public: trust it with --trusted-key {public}, key "
          f"{key_id(public.read_bytes())[:16]})")
    return private, public


# --- signing --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Signer:
    """A private key (PEM, elliptic curve P-256/384/521) and, where a PKI issued one, its
    certificate and the chain up to the root."""

    private_key: Path
    certificate: Path | None = None
    chain: tuple[Path, ...] = ()

    def public_pem(self) -> bytes:
        try:
            key = serialization.load_pem_private_key(self.private_key.read_bytes(), None)
        except (OSError, ValueError, TypeError) as e:
            raise ConfigError(f"signing key {self.private_key} does not read as an unencrypted "
                              f"PEM private key ({type(e).__name__}); make one with `draftkit "
                              f"keygen DIR`") from None
        return key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)

    def entry(self) -> SigningEntry:
        """What the manifest records of this signer (before the folder is signed: the
        signature covers the manifest)."""
        public = self.public_pem()
        return SigningEntry(method="certificate" if self.certificate else "key",
                            key_id=key_id(public), public_key=public.decode())

    def sign(self, bundle: Path) -> None:
        """Write ``bundle``/draftkit.sig: every other file of the folder, signed."""
        config = signing.Config().set_hashing_config(
            hashing.Config().set_ignored_paths(paths=[SIGNATURE]))
        try:
            if self.certificate is None:
                config.use_elliptic_key_signer(private_key=self.private_key)
            else:
                config.use_certificate_signer(private_key=self.private_key,
                                              signing_certificate=self.certificate,
                                              certificate_chain=self.chain)
            config.sign(bundle, bundle / SIGNATURE)
        except ValueError as e:  # an unsupported curve, a certificate for another key
            raise ConfigError(f"cannot sign with {self.private_key}: {e}; use an elliptic-curve "
                              f"key (`draftkit keygen DIR`)") from None


def signer_of(args: SigningArgs) -> Signer | None:
    """The signer a command's signing flags ask for (:func:`signer_from`)."""
    return signer_from(args.signing_key, args.signing_certificate, args.certificate_chain,
                       args.unsigned)


def signer_from(key: str | None, certificate: str | None = None, chain: list[str] | None = None,
                unsigned: bool = False) -> Signer | None:
    """The signer flags (or, where a flag is not given, ``DRAFTKIT_SIGNING_KEY`` and its
    certificate variables) ask for; None with ``unsigned``. No key and not ``unsigned`` is an
    error: a bundle is unsigned only when asked."""
    key = key or os.environ.get(KEY_ENV) or None
    certificate = certificate or os.environ.get(CERTIFICATE_ENV) or None
    chain = chain or [p for p in os.environ.get(CHAIN_ENV, "").split(os.pathsep) if p]
    if unsigned:
        if key or certificate:
            raise ConfigError("--unsigned and a signing key both given; drop one")
        return None
    if not key:
        raise ConfigError(f"a bundle is signed: pass --signing-key PEM (or set {KEY_ENV}; "
                          f"`draftkit keygen DIR` makes a key pair), or --unsigned to export "
                          f"it without a signature (its manifest says so)")
    for name, path in [("--signing-key", key), ("--signing-certificate", certificate),
                       *[("--certificate-chain", c) for c in chain]]:
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{name} {path} is not a file; pass the PEM file")
    signer = Signer(Path(key), Path(certificate) if certificate else None,
                    tuple(Path(c) for c in chain))
    signer.public_pem()  # an unreadable key is named before any work is done
    return signer


def new_key_pair(folder: str | Path) -> tuple[Path, Path]:
    """A new P-256 key pair in ``folder``: ``draftkit.key`` (private, mode 0600) and
    ``draftkit.pub``. An existing key is never overwritten."""
    folder = Path(folder)
    private, public = folder / "draftkit.key", folder / "draftkit.pub"
    for path in (private, public):
        if path.exists():
            raise ConfigError(f"{path} exists; keep it, or pass another folder")
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


# --- verifying ------------------------------------------------------------------------------------

def verify(root: str | Path, entry: SigningEntry | None) -> str:
    """Check the bundle at ``root`` against its signature with model-signing, as the process's
    trust setting asks (:func:`draftkit.bundle_signature.verify`, which the bundle's own
    launcher runs too); what was found, in words, or one ModelError line."""
    try:
        return signature.verify(Path(root), Path(root) / SIGNATURE,
                                entry.to_dict() if entry is not None else None)
    except SignatureError as e:
        raise ModelError(str(e)) from None
