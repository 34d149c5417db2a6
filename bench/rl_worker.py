"""One measurement of ``bench.rl``, in this process or in a fresh worker process.

A worker is ``python -m bench.rl --worker <json spec>``: it runs one system on one case and
prints the outcome on a line starting with ``MARK``, so that its peak RSS is that system's alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import BaselineUnavailable, Config
from bench.rl_cases import SYSTEMS, Case, System

ROOT = Path(__file__).resolve().parents[1]
MARK = "@@bench-result "


def _config_to_json(cfg: Config) -> dict[str, Any]:
    return asdict(cfg)


def _config_from_json(data: dict[str, Any]) -> Config:
    cfg = Config(**data)
    if cfg.env_kwargs:
        cfg.env_kwargs = {
            k: tuple(v) if isinstance(v, list) else v for k, v in cfg.env_kwargs.items()
        }
    return cfg


def run_one(system: System, case: Case, profile: bool = False) -> dict[str, Any]:
    """One measurement in this process: ``{"status": "ok"|"skipped"|"failed", ...}``."""
    reason = system.unavailable()
    if reason:
        return {"status": "skipped", "reason": reason}
    try:
        if profile:
            if system.profile is None:
                return {"status": "skipped", "reason": "no profile"}
            return {"status": "ok", "profile": system.profile(case.config, case.algo)}
        result = system.run(case.config, case.algo)
        return {"status": "ok", "result": asdict(result)}
    except (BaselineUnavailable, ImportError) as err:
        return {"status": "skipped", "reason": str(err)}
    except Exception as err:  # a system failing on one case must not end the benchmark
        tb = traceback.format_exc(limit=-3)
        return {"status": "failed", "reason": f"{type(err).__name__}: {err}", "traceback": tb}


def _worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    if threads == 1 and "multi_thread_eigen" not in env.get("XLA_FLAGS", ""):
        extra = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra}".strip()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_isolated(
    system: System, case: Case, profile: bool = False, timeout: float = 1800
) -> dict[str, Any]:
    """One measurement in a fresh Python process (its peak RSS is this system's alone)."""
    reason = system.unavailable()
    if reason:
        return {"status": "skipped", "reason": reason}
    spec = {
        "system": system.name,
        "config": _config_to_json(case.config),
        "algo": case.algo,
        "experiment": case.experiment,
        "label": case.label,
        "profile": profile,
    }
    cmd = [sys.executable, "-m", "bench.rl", "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env=_worker_env(case.config.threads),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"status": "failed", "reason": f"worker exited {proc.returncode}: {tail[0]}"}


def _worker(spec_json: str) -> int:
    spec = json.loads(spec_json)
    cfg = _config_from_json(spec["config"])
    if cfg.threads == 1 and spec["system"].startswith("jax"):
        from bench.baselines.jax_ppo import pin_xla_threads

        pin_xla_threads()
    case = Case(spec["experiment"], spec["label"], cfg, algo=spec["algo"])
    out = run_one(SYSTEMS[spec["system"]], case, profile=spec["profile"])
    print(MARK + json.dumps(out, default=str), flush=True)
    return 0
