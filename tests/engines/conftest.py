"""The engine tests' worker: one vLLM worker process for the session, in vLLM's own environment
(``make engines`` builds it), or a skip that says why (a failure under
DRAFTKIT_REQUIRE_ENGINES=1, as CI runs)."""

import os

import pytest

@pytest.fixture(scope="session")
def vllm_worker(tmp_path_factory, pytestconfig):
    from draftkit.engines.vllm import EngineError, VllmWorker

    try:
        # one thread: vLLM's CPU build spins its OpenMP threads, and beside another busy
        # process on a small machine two of them ran a tiny model's request 10-30x slower
        worker = VllmWorker(log=tmp_path_factory.mktemp("vllm") / "vllm.log", threads=1)
    except EngineError as e:
        if os.environ.get("DRAFTKIT_REQUIRE_ENGINES") == "1":
            pytest.fail(f"DRAFTKIT_REQUIRE_ENGINES=1 and vLLM is not usable: {e}")
        pytest.skip(f"vLLM is not usable here: {e}")
    pytestconfig.engine_label = worker.info.label  # the run's summary names it
    yield worker
    worker.close()
