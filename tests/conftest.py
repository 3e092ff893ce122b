import os
from collections import Counter

# Tests never talk to W&B or the hub.
os.environ["WANDB_MODE"] = "disabled"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# A rank of a multi-process test waits 60 s for the others, not 30 minutes: a stuck rank
# fails its launch with a line naming what it waited at (distill/distributed.py).
os.environ.setdefault("DRAFTKIT_DIST_TIMEOUT", "60")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

# Every bundle a test exports is signed, as a user's is, by one key made for the session (the
# processes tests start sign with it too); tests/export/test_signing.py tries the others.
_KEYS = tempfile.mkdtemp(prefix="draftkit-test-keys-")
atexit.register(shutil.rmtree, _KEYS, ignore_errors=True)
os.environ.pop("DRAFTKIT_TRUSTED_KEYS", None)


def _session_key() -> None:
    from draftkit.signing import KEY_ENV, new_key_pair

    os.environ[KEY_ENV] = str(new_key_pair(_KEYS)[0])


_session_key()


@pytest.fixture(autouse=True)
def _trust_unset(monkeypatch):
    """No test trusts a key it did not set: `draftkit ... --trusted-key` sets the process's
    DRAFTKIT_TRUSTED_KEYS (for the processes it starts), undone after each test."""
    monkeypatch.setenv("DRAFTKIT_TRUSTED_KEYS", "")


def pytest_collection_modifyitems(items):
    """A test on the embedded target or in an engine is slow too, so `-m "not slow"` is the
    quick layer."""
    for item in items:
        if item.get_closest_marker("embedded") or item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item):
    """An engine test's report carries the engine release and the control's line its process
    found (set on its config by tests/engines), so the summary names them under pytest-xdist
    too, where the tests run in other processes."""
    outcome = yield
    if item.get_closest_marker("engine"):
        for key in ("engine_label", "engine_control"):
            if getattr(item.config, key, None):
                outcome.get_result().user_properties.append((key, getattr(item.config, key)))


def pytest_terminal_summary(terminalreporter):
    """Name the engine release the engine tests ran on (or that they did not run)."""
    outcome: dict[str, str] = {}  # an engine test's id -> passed / failed / skipped / error
    found: dict[str, str] = {}  # engine_label, engine_control: as the tests' processes saw them
    for key in ("passed", "skipped", "failed", "error"):  # a later key overrides an earlier
        for report in terminalreporter.stats.get(key, []):
            if "engine" in getattr(report, "keywords", {}):
                outcome[report.nodeid] = key
            found.update(getattr(report, "user_properties", ()))
    if outcome:
        label = found.get("engine_label", "no engine")
        counts = Counter(outcome.values())
        terminalreporter.write_line(f"engine tests on {label}: " +
                                    ", ".join(f"{n} {key}" for key, n in counts.items()))
        control = found.get("engine_control")
        if control:  # the target drafting for itself in the engine
            terminalreporter.write_line(f"self-draft control on {label}: {control}")


@pytest.fixture(scope="session")
def embedded_dir():
    """The converted embedded target (converted once per machine, then cached)."""
    from draftkit.models.embedded import embedded_dir as convert

    return convert()


@pytest.fixture
def tiny_dirs(tmp_path):
    from tests.helpers import tiny_pair

    return tiny_pair(tmp_path)
