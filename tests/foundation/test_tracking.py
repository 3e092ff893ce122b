from dataclasses import dataclass

from draftkit.config import option
from draftkit.tracking import Tracker


@dataclass
class Cfg:
    lr: float = option(1e-3, help="lr")


def test_disabled_in_tests():
    with Tracker("test", Cfg()) as t:
        assert not t.enabled
        t.log({"x": 1.0}, step=0)  # a no-op, not an error


def test_other_ranks_do_not_log(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("RANK", "1")
    t = Tracker("test", Cfg(), out_dir=tmp_path)
    assert not t.enabled
    assert not (tmp_path / "wandb").exists()


def test_offline_by_default_logs_config(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with Tracker("test", Cfg(lr=0.5), out_dir=tmp_path, name="offline-check") as t:
        assert t.enabled
        assert t.run.settings.mode == "offline" or t.run.offline
        assert t.run.config["lr"] == 0.5
        t.log({"loss": 1.0}, step=1)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
