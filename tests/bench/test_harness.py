"""The side-by-side harness: end to end on a tiny config, ratios from the measured numbers,
unavailable and failing systems as rows, timerl's runner and profile."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench` is a top-level directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import rl, timerl_runner  # noqa: E402
from bench.common import BaselineUnavailable, Config, Result  # noqa: E402

TINY = ["--configs", "cartpole-l1", "--iterations", "3", "--repeats", "1"]


def _read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path) as fh:
        return {row["system"]: row for row in csv.DictReader(fh)}


def test_end_to_end_two_systems_ratio_from_measurements(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "bench"
    assert rl.main([*TINY, "--systems", "timerl_numpy,torch_ppo", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "timerl_numpy" in printed and "torch_ppo" in printed and "÷ torch_ppo" in printed
    rows = _read_csv(out / "results.csv")
    assert set(rows) == {"timerl_numpy", "torch_ppo"}
    timerl, base = rows["timerl_numpy"], rows["torch_ppo"]
    for row in (timerl, base):
        assert row["status"] == "ok" and row["config"] == "cartpole-l1"
        assert int(row["repeats"]) == 1 and float(row["env_steps_per_s"]) > 0
        assert float(row["peak_rss_mib"]) > 0 and float(row["setup_s"]) >= 0
        # steps/s is the batch over the steady-state seconds per iteration
        batch = int(row["num_envs"]) * int(row["num_steps"])
        assert batch == 16 * 128
        expect = batch / float(row["seconds_per_iteration"])
        assert float(row["env_steps_per_s"]) == pytest.approx(expect, rel=1e-4)
    ratio = float(timerl["ratio_vs_torch_ppo"])
    expect = float(timerl["env_steps_per_s"]) / float(base["env_steps_per_s"])
    assert ratio == pytest.approx(expect, rel=1e-4)
    assert base["ratio_vs_torch_ppo"] == ""  # ratios belong to timerl rows only
    assert float(timerl["framework_peak_mib"]) > 0
    assert (out / "table.md").read_text().count("cartpole-l1") == 2
    assert (out / "depth.png").stat().st_size > 0


def _fake_result(name: str, cfg: Config, steps_per_s: float) -> Result:
    cfg = cfg.resolved()
    per_iter = cfg.batch_size / steps_per_s
    return Result(name, vars(cfg).copy(), steps_per_s, per_iter, per_iter, 0.1, 1.0,
                  cfg.batch_size * cfg.iterations, 2**20, None, [1.0] * cfg.iterations)  # fmt: skip


def test_unavailable_and_failing_systems_become_rows(tmp_path):
    def unavailable(cfg: Config, algo: str) -> Result:
        raise BaselineUnavailable("needs a package that is not here")

    def broken(cfg: Config, algo: str) -> Result:
        raise RuntimeError("boom")

    calls: list[str] = []

    def fake(name: str, sps: float):
        def run(cfg: Config, algo: str) -> Result:
            calls.append(name)
            return _fake_result(name, cfg, sps)

        return run

    systems = {
        "timerl_x": rl.System("timerl_x", "timerl", "*", fake("timerl_x", 3000.0)),
        "base_a": rl.System("base_a", "baseline", "ppo", fake("base_a", 1500.0)),
        "base_missing": rl.System(
            "base_missing", "baseline", "ppo", fake("m", 1.0), needs=("no_such_module_for_bench",)
        ),  # fmt: skip
        "base_unavail": rl.System("base_unavail", "baseline", "ppo", unavailable),
        "base_broken": rl.System("base_broken", "baseline", "ppo", broken),
        "base_reinforce": rl.System("base_reinforce", "baseline", "reinforce", fake("r", 1.0)),
    }
    case = rl.Case("depth", "tiny", Config("CartPole-v1", num_envs=2, num_steps=8, iterations=2))
    rows = rl.run_benchmark(
        [case], list(systems), repeats=3, isolated=False, systems=systems, log=lambda s: None
    )
    by = {r.system: r for r in rows}
    assert "base_reinforce" not in by  # another algorithm: not compared on a PPO case
    assert by["base_missing"].status == "skipped" and "no_such_module" in by["base_missing"].reason
    assert by["base_unavail"].status == "skipped"
    assert by["base_broken"].status == "failed" and "boom" in by["base_broken"].reason
    assert calls.count("timerl_x") == 3 and calls.count("base_a") == 3
    assert by["timerl_x"].ratios == {"base_a": pytest.approx(2.0)}
    path = tmp_path / "r.csv"
    rl.write_csv(rows, path)
    table = _read_csv(path)
    assert table["base_unavail"]["status"] == "skipped"
    assert "ratio_vs_base_unavail" not in table["timerl_x"]
    assert float(table["timerl_x"]["ratio_vs_base_a"]) == pytest.approx(2.0)
    rl.print_table(rows, "t")  # skipped and failed rows print
    header, cells = rl.table_rows(rows)
    assert header[-1] == "÷ base_a" and len(cells) == 5


def test_rotation_alternates_system_order():
    order: list[str] = []

    def fake(name: str):
        def run(cfg: Config, algo: str) -> Result:
            order.append(name)
            return _fake_result(name, cfg, 100.0)

        return run

    systems = {n: rl.System(n, "baseline", "*", fake(n)) for n in ("a", "b", "c")}
    case = rl.Case("x", "x", Config("CartPole-v1", num_envs=2, num_steps=4, iterations=2))
    rl.run_benchmark([case], ["a", "b", "c"], 3, False, systems, log=lambda s: None)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_the_budgeted_system_takes_eager_data_over_16_or_the_budget_given():
    budgets: list[int | None] = []

    def budgeted(cfg: Config, algo: str) -> Result:
        budgets.append(cfg.memory_budget)
        return _fake_result("timerl_budget", cfg, 100.0)

    def eager(cfg: Config, algo: str) -> Result:
        out = _fake_result("torch_ppo", cfg, 50.0)
        return dataclasses.replace(out, base_rss_bytes=2**20, peak_rss_bytes=161 * 2**20)

    case = rl.Case("x", "x", Config("CartPole-v1", num_envs=2, num_steps=4, iterations=2))
    alone = {"timerl_budget": rl.System("timerl_budget", "timerl", "*", budgeted)}
    rows = rl.run_benchmark([case], ["timerl_budget"], 1, False, alone, log=lambda s: None)
    assert rows[0].status == "skipped" and "--budget" in rows[0].reason
    rl.run_benchmark([case], ["timerl_budget"], 1, False, alone, log=lambda s: None, budget=7)
    both = {**alone, "torch_ppo": rl.System("torch_ppo", "baseline", "ppo", eager)}
    rl.run_benchmark([case], list(both), 1, False, both, log=lambda s: None, budget=7)
    assert budgets == [7, 10 * 2**20]  # eager PyTorch in the run: its data / 16


def test_timerl_config_mapping():
    cfg = Config("Synthetic-v0", num_envs=4, num_steps=16, hidden_layers=3, hidden_size=8)
    mapped = timerl_runner.timerl_config(cfg)
    assert mapped["hidden"] == (8, 8, 8) and mapped["anneal_lr"] is False
    assert mapped["env_kwargs"]["obs_shape"] == (3, 4, 4) and mapped["lr"] == 3e-4
    assert mapped["epochs"] == 1 and mapped["minibatches"] == 1 and mapped["clip"] == 0.2
    assert timerl_runner.timerl_config(cfg, "reinforce")["baseline"] is True
    # timerl_jax runs the JAX-native env inside the program where one exists, like jax_ppo
    assert mapped["env_backend"] == "gymnasium"
    assert timerl_runner.timerl_config(cfg, "ppo", "jax")["env_backend"] == "jax"
    pendulum = Config("Pendulum-v1", num_envs=2, num_steps=4)
    assert timerl_runner.timerl_config(pendulum, "ppo", "jax")["env_backend"] == "gymnasium"


def test_timerl_runner_returns_and_profile():
    # one compile serves both: the profiled run measures like run() and adds the breakdown
    small = Config("CartPole-v1", num_envs=4, num_steps=32, iterations=4, hidden_size=16)
    prof = timerl_runner.profiled(small)
    result = Result(**prof["result"])
    assert result.baseline == "timerl_numpy"
    assert len(result.returns) == 4 and result.total_env_steps == 4 * 4 * 32
    assert result.env_steps_per_s > 0 and result.setup_s > 0
    assert result.framework_peak_bytes and result.framework_peak_bytes > 0
    assert any(not math.isnan(r) for r in result.returns)

    assert prof["env_s"] > 0 and prof["kernels_s"] > 0 and prof["compile_s"] > 0
    assert prof["env_calls"] >= 4 * 32  # one step per rollout step (+ the reset)
    assert prof["env_s"] + prof["kernels_s"] <= prof["run_s"] * 1.05
    # host calls (the env step's wrapper and conversions, metrics) are timed apart from the
    # env's own step and from the executor: one per rollout step at least
    assert prof["host_calls"] >= 4 * 32 and 0 < prof["host_s"] < prof["run_s"]
    assert prof["env_s"] + prof["kernels_s"] + prof["host_s"] <= prof["run_s"] * 1.05
    assert prof["executor_s"] <= prof["executor_uncorrected_s"] - prof["host_s"] + 1e-9
    assert prof["top_kernels"] and prof["kernel_calls"] > 0
    # the timers' own cost (measured on a no-op kernel) is taken out of the executor's share
    assert 0 < prof["timers_s"] < prof["run_s"]
    assert prof["executor_s"] < prof["executor_uncorrected_s"]
    assert "_probe" not in [p for p, _, _ in prof["top_kernels"]]
    # the patches are gone afterwards
    from timerl.rl.envs import VectorEnv
    from timerl.runtime.numpy_backend import NumpyBackend

    assert VectorEnv.step.__qualname__ == "VectorEnv.step"
    from timerl.runtime import calls, statements

    assert calls.host_call is statements.host_call
    assert calls.host_call.__qualname__ == "host_call"
    assert NumpyBackend.lowering.__qualname__ == "NumpyBackend.lowering"


def test_the_prologue_before_the_first_iteration_counts_as_setup():
    # the initial parameters and the env's reset run before the loop, as an eager loop's
    # model and reset do before it: setup, not the first iteration
    small = Config("CartPole-v1", num_envs=4, num_steps=32, iterations=3, hidden_size=16)
    cfg, out, records, start = timerl_runner._train(small, "ppo", "numpy")
    assert 0 < out.prologue_seconds < records[0][1]["seconds"]
    result = timerl_runner._result(cfg, out, records, start, "ppo", "numpy")
    first = records[0][1]["seconds"] - out.prologue_seconds
    assert result.first_iteration_s == pytest.approx(first)
    out.prologue_seconds = 0.0  # counted as the first iteration's, setup is shorter by it
    plain = timerl_runner._result(cfg, out, records, start, "ppo", "numpy")
    assert plain.first_iteration_s == pytest.approx(records[0][1]["seconds"])
    assert plain.setup_s < result.setup_s


def test_profile_times_the_kernels_of_a_backend_using_the_base_lookup():
    """The torch backend takes its kernels through ``Backend.lowering`` (it does not
    override it): its matmuls count as kernels, not as executor time."""
    pytest.importorskip("torch")
    from timerl.runtime.backend import Backend

    small = Config("CartPole-v1", num_envs=4, num_steps=32, iterations=2, hidden_size=16)
    prof = timerl_runner.profiled(small, backend="torch")
    assert "matmul" in [p for p, _, _ in prof["top_kernels"]]
    assert prof["kernels_s"] > 0
    assert Backend.lowering.__qualname__ == "Backend.lowering"


def test_profile_times_the_kernels_a_backend_chooses_per_op():
    # a product whose static shapes decide its kernel (``Backend.specialisations``) skips
    # ``lowering``; its time is the kernels', not the executor's
    import numpy as np

    import timerl as tl
    from timerl.runtime.numpy_backend import NumpyBackend

    ctx = tl.Context(dims=("t",))
    with ctx:
        y = tl.ones((4, 8)) @ tl.ones((8, 3))
    with timerl_runner.instrumented() as timers:
        kernel = NumpyBackend().kernel(y.op)
        out = kernel(np.ones((4, 8), np.float32), np.ones((8, 3), np.float32))
    assert out.shape == (4, 3) and timers.kernel_calls["matmul"] == 1
    assert NumpyBackend.specialisations["matmul"].__qualname__ == "_matmul_for"


def test_cli_forwards_to_bench(capsys):
    from timerl import bench_cli

    parser = argparse.ArgumentParser(prog="timerl")
    sub = parser.add_subparsers(dest="command", required=True)
    bench_cli.register(sub)
    args = parser.parse_args(["bench", "rl", "--list", "--quick"])
    assert args.args == ["--list", "--quick"]
    assert args.func(args) == 0
    listed = capsys.readouterr().out
    assert "synthetic-e256" in listed and "memory-e4" in listed and "reinforce-cartpole" in listed


def test_unknown_config_is_an_error():
    with pytest.raises(SystemExit, match="unknown configuration"):
        rl.main(["--configs", "nope"])
