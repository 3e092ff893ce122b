import os

# Tests never talk to W&B or the hub.
os.environ["WANDB_MODE"] = "disabled"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402


def pytest_collection_modifyitems(items):
    """A test on the embedded target is slow too, so `-m "not slow"` is the quick layer."""
    for item in items:
        if item.get_closest_marker("embedded"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def embedded_dir():
    """The converted embedded target (converted once per machine, then cached)."""
    from draftkit.models.embedded import embedded_dir as convert

    return convert()


@pytest.fixture
def tiny_dirs(tmp_path):
    from tests.helpers import tiny_pair

    return tiny_pair(tmp_path)
