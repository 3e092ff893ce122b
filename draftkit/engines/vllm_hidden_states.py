"""vLLM's hidden-states connector, made to run where there is no accelerator: runs inside vLLM's
environment (the worker loads it by module path), never in draftkit's.

vLLM's ``extract_hidden_states`` speculative method keeps the target's hidden states at the
layers named in ``eagle_aux_hidden_state_layer_ids`` in a cache group of their own, and its
``ExampleHiddenStatesConnector`` writes each finished request's rows to a safetensors file
(``hidden_states`` (T, layers, H), ``token_ids`` (T,)). Its write path assumes CUDA: it copies
into pinned memory on a CUDA stream and polls a CUDA event, both of which fail with CPU-only
torch (vLLM 0.32: "pin_memory=True requires a CUDA or other accelerator backend"; the engine
then waits on the file's lock forever). This subclass writes the same file synchronously, from
the cache rows, and marks the request done at once; everything else is vLLM's own.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, extract_from_kv_cache)


class _Written:
    """Stands in for the CUDA event vLLM polls: the file is already written."""

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        size = self._block_size
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * size + torch.arange(size)[None, :]).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0])
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock = self._lock_fds.pop(pending.req_id, None)
        try:
            save_file({"hidden_states": states.clone().contiguous(),
                       "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            if lock is not None:
                os.close(lock)  # releases the lock readers wait on
        self._req_copy_events[pending.req_id] = _Written()
