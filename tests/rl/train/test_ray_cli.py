"""``timerl train --workers N --ray-address ADDR`` reaches the training driver (no Ray needed)."""

from __future__ import annotations

from types import SimpleNamespace

from timerl.cli import main


def test_workers_and_ray_address_flags_reach_train(monkeypatch, capsys):
    import timerl.rl.train.driver as train_module

    got = {}

    def fake_train(algo, config, **kwargs):
        got.update(kwargs, algo=algo, config=config)
        return SimpleNamespace(summary=lambda: "trained")

    monkeypatch.setattr(train_module, "train", fake_train)
    argv = ["train", "ppo", "--env", "Synthetic-v0", "--steps", "64", "--no-progress"]
    assert main([*argv, "--workers", "3", "--ray-address", "10.0.0.1:6379"]) == 0
    assert got["workers"] == 3 and got["ray_address"] == "10.0.0.1:6379"
    assert "workers" not in got["config"]  # not a hyper-parameter: resuming compares none
    assert main(argv) == 0
    assert got["workers"] == 0 and got["ray_address"] is None
    assert "trained" in capsys.readouterr().out
