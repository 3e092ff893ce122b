"""vLLM's own OpenAI servers, started for ``draftkit serve BUNDLE --engine vllm``: one process per
replica, in vLLM's environment (:func:`draftkit.engines.vllm.find_python`).

Each replica runs the command the bundle's own ``serving/preflight.py`` composes for the
installed release, as ``serving/vllm.sh`` would: the seal and file hashes checked, the target
checked against the hash the bundle records, the speculative config for that release (vLLM's CPU
build through its OpenAI server module, whose ``vllm`` command cannot start). The front adds
what it needs: the address (loopback, a free port), the served model name,
``--per-request-spec-decode-metrics detailed`` (each response's acceptance per verify step, which
recording reads), the tensor-parallel size; then the user's own vLLM flags (``--engine-args``).

Where the replicas run:

- GPUs: replica i gets GPUs i*T .. i*T+T-1 of those visible (``CUDA_VISIBLE_DEVICES`` or
  ``nvidia-smi -L``), T the tensor-parallel size; too few GPUs for them all is refused.
- CPU build: the cores this process may use are split between replicas (and between each
  one's tensor-parallel ranks) through ``VLLM_CPU_OMP_THREADS_BIND``, so replicas do not fight
  over the same cores; each gets the KV cache its sequences need
  (:func:`draftkit.engines.vllm_worker.cpu_kv_cache_bytes`) rather than the build's default,
  and runs eager (compiling its graphs takes minutes on a small CPU). A user's own
  ``VLLM_CPU_OMP_THREADS_BIND``, ``VLLM_CPU_KVCACHE_SPACE`` or flags win. On the releases
  known to reject every sampled draft (vllm-project/vllm#55005), draftkit's correction
  (:mod:`draftkit.engines.vllm_cpu_fix`) goes in as ``sitecustomize`` (``--vllm-cpu-fix``).

A replica is started in a session of its own (vLLM spawns its engine core as a child), stopped
with SIGTERM to that session (vLLM finishes its requests and exits), and killed after
:data:`STOP_S` seconds. Its output goes to a log file (``--engine-log-dir``, else the temporary
folder, where it is removed once the replica stops, unless a failure's message names it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from draftkit.engines.vllm import (CPU_FIX, EngineError, cpu_fix_applies, find_python,
                                  installed_release, last_log_line)
from draftkit.engines.vllm_worker import cpu_kv_cache_bytes
from draftkit.decode.sampling_params import DRAFT_SAMPLE_METHODS, GREEDY_DRAFT
from draftkit.engines.preflight import flag_value

START_S = 900.0  # how long a replica may take to answer /health
STOP_S = 30.0  # how long a replica may take to exit on SIGTERM
SPEC_METRICS = ("--per-request-spec-decode-metrics", "detailed")


@dataclass
class Replica:
    """One running vLLM server."""

    process: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    log: Path
    bundle: str
    gpus: str | None = None  # its CUDA_VISIBLE_DEVICES
    cores: str | None = None  # its VLLM_CPU_OMP_THREADS_BIND
    own_log: bool = False  # a log in the temporary folder: removed once it stops cleanly
    failed: bool = False  # a failure's message names its log: kept
    support: Path | None = None  # a folder of the front's for it (the correction): removed
    # how its drafts are chosen at temperature > 0 (its speculative config's
    # draft_sample_method; vLLM drafts greedily where the config, or the release, has none)
    draft_sample_method: str = "greedy"

    def stop(self) -> None:
        """SIGTERM to its session, SIGKILL after STOP_S seconds; its own log removed unless a
        failure named it."""
        for sig, wait in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, 10.0)):
            if self.process.poll() is not None:
                break
            try:
                os.killpg(self.process.pid, sig)
                self.process.wait(wait)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        if self.own_log and not self.failed:
            self.log.unlink(missing_ok=True)
        if self.support is not None:
            shutil.rmtree(self.support, ignore_errors=True)


@dataclass
class Launch:
    """What every replica of one front shares: vLLM's Python and release, the served name,
    the tensor-parallel size, the user's flags and environment."""

    python: Path
    release: str  # as preflight takes it: 0.32.0, or 0.32.0+cpu
    name: str  # the model name the replicas serve
    tensor_parallel_size: int = 1
    engine_args: tuple[str, ...] = ()
    target: str | None = None  # --target: the target folder, else the bundle's
    log_dir: Path | None = None
    cpu_fix: bool = False  # draftkit's correction of the CPU build's sampled verification

    @classmethod
    def find(cls, name: str, engine_python: str | None = None, cpu_fix: str = "auto",
             **kw) -> Launch:
        """``cpu_fix``: auto, on, off (:func:`draftkit.engines.vllm.cpu_fix_applies`)."""
        python = find_python(engine_python)
        release = installed_release(python)
        return cls(python, release, name, cpu_fix=cpu_fix_applies(release, cpu_fix), **kw)

    def environment(self, folder: Path) -> dict[str, str]:
        """What a replica's environment adds for the correction: ``folder`` holding it as
        ``sitecustomize.py``, first on ``PYTHONPATH`` (every process vLLM spawns inherits it)."""
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CPU_FIX, folder / "sitecustomize.py")
        paths = [str(folder)] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
        return {"PYTHONPATH": ":".join(paths)}

    @property
    def cpu(self) -> bool:
        return self.release.endswith("+cpu")

    def command(self, bundle: str, port: int) -> list[str]:
        """The bundle's preflight's command for this release, with the front's flags."""
        preflight = Path(bundle) / "serving" / "preflight.py"
        if not preflight.is_file():
            raise EngineError(f"{bundle} has no serving/preflight.py; give a bundle from "
                              f"`draftkit export`")
        front = ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", self.name,
                 *SPEC_METRICS, "--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.cpu and "--no-enforce-eager" not in self.engine_args:
            front.append("--enforce-eager")
        args = [*front, *self.engine_args]
        target = ["--target", self.target] if self.target else []
        done = subprocess.run([sys.executable, "-I", str(preflight), "vllm", self.release,
                               *target, *args], capture_output=True, text=True, timeout=600)
        for line in done.stderr.splitlines():  # its warnings (a sampled path known broken,
            if not (self.cpu_fix and "sampled speculative decoding is broken" in line):
                print(line, file=sys.stderr, flush=True)  # unless corrected here)
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()
            why = said[-1].removeprefix("draftkit bundle: ") if said else "no message"
            raise EngineError(f"the bundle's preflight refused to start vLLM: {why}")
        argv = done.stdout.splitlines()
        if argv[0] == "python":  # the CPU build's server module, in vLLM's environment
            argv[0] = str(self.python)
        elif argv[0] == "vllm":
            command = self.python.parent / "vllm"
            argv[0] = str(command) if command.is_file() else shutil.which("vllm") or "vllm"
        return argv

    def kv_cache(self, argv: list[str], target: str) -> list[str]:
        """On the CPU build, a KV cache the sequences need, unless the user sized it."""
        if not self.cpu or "VLLM_CPU_KVCACHE_SPACE" in os.environ or \
                flag_value(argv, ("--kv-cache-memory-bytes", "--gpu-memory-utilization")):
            return []
        length = flag_value(argv, ("--max-model-len",))
        seqs = flag_value(argv, ("--max-num-seqs",))
        try:
            config = json.loads((Path(target) / "config.json").read_text())
            config = config.get("text_config", config)
            length = int(length) if length else int(config.get("max_position_embeddings", 2048))
            seqs = int(seqs) if seqs else None
        except (OSError, ValueError):
            return []
        return ["--kv-cache-memory-bytes", str(cpu_kv_cache_bytes(target, length, seqs))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_ids() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES``, else those ``nvidia-smi -L``
    lists; none on a machine without NVIDIA GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU")]


def placements(n: int, tp: int, cpu: bool) -> list[dict[str, str]]:
    """The environment each of ``n`` replicas of tensor-parallel size ``tp`` runs with (the
    module docstring); a one-line EngineError where the machine cannot hold them."""
    if not cpu:
        gpus = gpu_ids()
        if len(gpus) < n * tp:
            raise EngineError(f"{n} replica(s) at tensor-parallel size {tp} need {n * tp} GPUs; "
                              f"{len(gpus)} are visible; lower --replicas or "
                              f"--tensor-parallel-size")
        return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * tp:(i + 1) * tp])}
                for i in range(n)]
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return [{} for _ in range(n)]
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // (n * tp)
    if per < 1:
        raise EngineError(f"{n} replica(s) at tensor-parallel size {tp} need {n * tp} CPU "
                          f"cores; this process may use {len(cores)}; lower --replicas or "
                          f"--tensor-parallel-size")
    out = []
    for i in range(n):
        ranks = []
        for r in range(tp):
            chunk = cores[(i * tp + r) * per:(i * tp + r + 1) * per]
            ranks.append(f"{chunk[0]}-{chunk[-1]}" if len(chunk) > 1 else str(chunk[0]))
        out.append({"VLLM_CPU_OMP_THREADS_BIND": "|".join(ranks)})
    return out


def draft_sample_method(argv: list[str]) -> str:
    """How a vLLM command's server chooses drafts at temperature > 0: its speculative config's
    ``draft_sample_method``, else greedy (vLLM's default, and what releases without the key
    do)."""
    try:
        spec = json.loads(flag_value(argv, ("--speculative-config",)) or "{}")
    except ValueError:
        spec = {}
    method = spec.get("draft_sample_method") if isinstance(spec, dict) else None
    return method if method in DRAFT_SAMPLE_METHODS else GREEDY_DRAFT


def start(launch: Launch, bundle: str, place: dict[str, str], index: int) -> Replica:
    """Start one replica (not waiting for it: :func:`wait_ready`)."""
    port = free_port()
    argv = launch.command(bundle, port)
    target = argv[argv.index("--model") + 1] if "--model" in argv else argv[2]
    argv += launch.kv_cache(argv, target)
    folder = launch.log_dir or Path(tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"draftkit-vllm-{os.getpid()}-{index}-{port}.log"
    support = folder / f"{log.stem}-cpu-fix" if launch.cpu_fix else None
    env = {**os.environ, **place, "TOKENIZERS_PARALLELISM": "false",
           **(launch.environment(support) if support else {})}
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    return Replica(process, f"http://127.0.0.1:{port}", log, bundle,
                   place.get("CUDA_VISIBLE_DEVICES"), place.get("VLLM_CPU_OMP_THREADS_BIND"),
                   own_log=launch.log_dir is None, support=support,
                   draft_sample_method=draft_sample_method(argv))


def wait_ready(replicas: list[Replica], timeout: float = START_S, progress=None) -> None:
    """Wait until every replica answers ``/health``; a replica that exits or does not answer
    in ``timeout`` seconds stops them all and raises one line naming its log."""
    waiting = list(replicas)
    deadline = time.monotonic() + timeout
    while waiting:
        for r in list(waiting):
            code = r.process.poll()
            if code is not None:
                r.failed = True
                stop_all(replicas)
                raise EngineError(f"vLLM exited while starting (status {code}): "
                                  f"{last_log_line(r.log) or 'no message'}; its log: {r.log}")
            try:
                if httpx.get(f"{r.url}/health", timeout=2.0).status_code == 200:
                    waiting.remove(r)
                    if progress is not None:
                        progress(r)
            except httpx.HTTPError:
                pass
        if waiting and time.monotonic() > deadline:
            waiting[0].failed = True
            stop_all(replicas)
            raise EngineError(f"vLLM did not answer /health within {timeout:g} s; its log: "
                              f"{waiting[0].log}")
        if waiting:
            time.sleep(0.5)


def stop_all(replicas: list[Replica]) -> None:
    for r in replicas:
        if r.process.poll() is None:
            try:
                os.killpg(r.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for r in replicas:
        r.stop()
