"""draftkit's correction of vLLM's CPU build's sampled verification (vllm-project/vllm#55005),
without vLLM: the corrected expand kernel does what the rejection sampler's Triton kernel does,
into the output's own dtype, and the import hook puts it in place of the module's function
however the module is reached. (With vLLM: tests/engines/test_vllm.py's controls.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from draftkit.engines.vllm import CPU_FIX, cpu_fix_applies
from draftkit.engines.vllm_cpu_fix import expand_kernel


def reference(output, values, ends, replace_from, replace_to):
    """The Triton kernel, request by request (vllm/v1/sample/rejection_sampler.py)."""
    start = 0
    for value, end in zip(values.tolist(), ends.tolist()):
        output[start:end] = replace_to if value == replace_from else value
        start = end


def test_the_expand_kernel_fills_the_float_buffer_itself():
    temperatures = torch.tensor([0.7, 0.0, 1.3], dtype=torch.float32)
    ends = torch.tensor([3, 4, 7], dtype=torch.int32)
    out = torch.full((9,), -7.0)
    want = out.clone()
    expand_kernel(out, temperatures, ends, 0.0, 1.0)
    reference(want, temperatures, ends, 0.0, 1.0)
    assert torch.equal(out, want) and out[3] == 1.0 and out[7] == -7.0
    ids = torch.tensor([5, -1], dtype=torch.int32)
    got = torch.zeros(4, dtype=torch.int32)
    expand_kernel(got, ids, torch.tensor([1, 4]), -1, 9)
    assert got.tolist() == [5, 9, 9, 9] and got.dtype == torch.int32


def test_the_hook_patches_the_module_when_it_is_imported(tmp_path):
    """A stand-in vllm package whose cpu_triton_utils has the broken function; the platform's
    registration reads the module attribute once imported, as vLLM's does."""
    pkg = tmp_path / "vllm" / "utils"
    pkg.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cpu_triton_utils.py").write_text("def _expand_kernel_impl(*a):\n    return 'broken'\n")
    (tmp_path / "sitecustomize.py").write_text(CPU_FIX.read_text())
    script = textwrap.dedent("""
        import vllm.utils.cpu_triton_utils as m
        print(m._expand_kernel_impl.__module__, getattr(m, "draftkit_corrected", None))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": str(tmp_path)})
    assert done.stdout.split() == ["sitecustomize", "vllm-project/vllm#55005"], done.stderr
    plain = subprocess.run([sys.executable, "-S", "-c", script], cwd=tmp_path,
                           capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)})
    assert plain.stdout.split() == ["vllm.utils.cpu_triton_utils", "None"], plain.stderr


def test_the_correction_is_on_by_default_only_where_the_defect_is_known():
    assert cpu_fix_applies("0.32.0+cpu") and cpu_fix_applies("0.20.0+cpu")
    assert not cpu_fix_applies("0.32.0")  # the CUDA build has no such wrapper
    assert not cpu_fix_applies("0.19.0+cpu") and not cpu_fix_applies("0.33.0+cpu")
    assert cpu_fix_applies("0.33.0+cpu", "on") and not cpu_fix_applies("0.32.0+cpu", "off")


def test_eval_takes_the_flag_with_the_engine_only():
    import pytest

    from draftkit.errors import ConfigError
    from draftkit.evaluate.command import EvalArgs

    with pytest.raises(ConfigError, match="--vllm-cpu-fix is for --engine vllm"):
        EvalArgs(target="t", draft="d", vllm_cpu_fix="off").validate()
    EvalArgs(target="t", draft="d", engine="vllm", vllm_cpu_fix="off").validate()
