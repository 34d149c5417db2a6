"""Results of ``bench.rl`` and how they are reported: per-(case, system) rows with their
medians and ratios, the console and markdown tables, the CSV, the memory-budget and accounting
lines, the profile table and the plots."""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.rl_cases import BUDGET_FRACTION, BUDGETED, EAGER, EXPERIMENTS, Case

# --------------------------------------------------------------------------------------------
# rows: one (case, system) and its repetitions


@dataclass
class Row:
    case: Case
    system: str
    kind: str
    status: str = "ok"
    reason: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)  # baseline -> timerl/baseline

    def median(self, key: str) -> float:
        values = [r[key] for r in self.results if r.get(key) is not None]
        return float(statistics.median(values)) if values else math.nan

    def median_gap(self, high: str, low: str) -> float:
        """Median of ``high - low`` over the results that measured both (NaN if none)."""
        values = [r[high] - r[low] for r in self.results if r.get(low) and r.get(high)]
        return float(statistics.median(values)) if values else math.nan

    @property
    def data_bytes(self) -> float:
        """Median peak RSS minus RSS after imports: the run's data (NaN if not measured)."""
        return self.median_gap("peak_rss_bytes", "base_rss_bytes")

    @property
    def run_data_bytes(self) -> float:
        """Median peak RSS of the run minus RSS after imports and compile (timerl only)."""
        return self.median_gap("run_peak_rss_bytes", "run_base_rss_bytes")

    @property
    def steps_per_s(self) -> float:
        return self.median("env_steps_per_s")

    @property
    def spread(self) -> float:
        """(max - min) / median of env steps/s over the repetitions."""
        values = [r["env_steps_per_s"] for r in self.results]
        if len(values) < 2:
            return math.nan
        return (max(values) - min(values)) / statistics.median(values)

    @property
    def last_return(self) -> float:
        if not self.results:
            return math.nan
        tail = [r for r in self.results[0]["returns"][-5:] if not math.isnan(r)]
        return sum(tail) / len(tail) if tail else math.nan


def budget_lines(rows: list[Row]) -> list[str]:
    """Per budgeted run: the budget, whether the data memory stayed within it, the time ratio."""
    out = []
    by_case = {(r.case.label, r.system): r for r in rows}
    for row in rows:
        if row.system != BUDGETED or row.status != "ok" or not row.results:
            continue
        eager = by_case.get((row.case.label, EAGER.get(row.case.algo, "")))
        budget = row.median("memory_budget_bytes")
        data = row.data_bytes
        planned = row.median("planned_peak_bytes")
        compiled = all(r.get("within_budget") for r in row.results)
        ratio = (
            row.median("seconds_per_iteration") / eager.median("seconds_per_iteration")
            if eager is not None and eager.status == "ok"
            else math.nan
        )
        out.append(
            f"{row.system} {row.case.label}: budget {_mib(budget):.1f} MiB "
            + (
                f"(eager data {_mib(eager.data_bytes):.0f} MiB / {BUDGET_FRACTION}); "
                if eager is not None and eager.status == "ok"
                else "(--budget); "
            )
            + f"planned peak {_mib(planned):.1f} MiB ({'fits' if compiled else 'over: ran at the smallest budget that fits'}); "
            f"data {_mib(data):.1f} MiB, within budget: {'yes' if data <= budget else 'no'}; "
            f"iteration time {ratio:.2f}x eager"
        )
    return out + accounting_lines(rows)


ACCOUNTING_TOLERANCE = 0.10  # the meter's peak against the run's measured data memory


def accounting_lines(rows: list[Row]) -> list[str]:
    """Per timerl run measured both ways: its meter's peak (``stats()["peak_bytes"]``) against
    the run's data memory after imports and compile (peak RSS of the run minus RSS then), on
    the memory experiment (a small program's few MiB are below what RSS resolves)."""
    out = []
    for row in rows:
        if row.case.experiment != "memory":
            continue
        if any(r.get("config", {}).get("device", "cpu") != "cpu" for r in row.results):
            continue  # on an accelerator the peak is the device's, not the host's RSS
        run_data = row.run_data_bytes
        metered = row.median("framework_peak_bytes")
        if row.status != "ok" or math.isnan(run_data) or math.isnan(metered) or metered <= 0:
            continue
        off = run_data / metered - 1
        out.append(
            f"{row.system} {row.case.label}: metered peak {_mib(metered):.1f} MiB, run data "
            f"{_mib(run_data):.1f} MiB after imports and compile ({off:+.0%}; within "
            f"{ACCOUNTING_TOLERANCE:.0%}: {'yes' if abs(off) <= ACCOUNTING_TOLERANCE else 'no'}); "
            f"data after imports {_mib(row.data_bytes):.1f} MiB"
        )
    return out


def compute_ratios(rows: list[Row]) -> None:
    """Fill each timerl row's ratio over every baseline measured on the same case."""
    by_case: dict[str, list[Row]] = {}
    for row in rows:
        by_case.setdefault(row.case.label, []).append(row)
    for group in by_case.values():
        bases = [r for r in group if r.kind == "baseline" and r.status == "ok"]
        for row in group:
            if row.kind != "timerl" or row.status != "ok":
                continue
            for base in bases:
                if base.steps_per_s > 0:
                    row.ratios[base.system] = row.steps_per_s / base.steps_per_s


# --------------------------------------------------------------------------------------------
# output


def baseline_names(rows: list[Row]) -> list[str]:
    seen: list[str] = []
    for row in rows:
        if row.kind == "baseline" and row.status == "ok" and row.system not in seen:
            seen.append(row.system)
    return seen


def _mib(value: float | None) -> float:
    return math.nan if value is None or math.isnan(value) else value / 2**20


CSV_FIELDS = [
    "experiment",
    "config",
    "system",
    "status",
    "reason",
    "repeats",
    "env_steps_per_s",
    "env_steps_per_s_all",
    "spread",
    "seconds_per_iteration",
    "first_iteration_s",
    "setup_s",
    "peak_rss_mib",
    "data_mib",
    "framework_peak_mib",
    "last_return",
    "algo",
    "env_id",
    "obs_shape",
    "num_envs",
    "num_steps",
    "hidden_layers",
    "hidden_size",
    "epochs",
    "minibatches",
    "iterations",
    "lr",
    "threads",
]


def to_records(rows: list[Row]) -> tuple[list[dict[str, Any]], list[str]]:
    bases = baseline_names(rows)
    ratio_fields = [f"ratio_vs_{b}" for b in bases]
    records = []
    for row in rows:
        c = row.case.config.resolved()
        obs = c.env_kwargs.get("obs_shape")
        rec: dict[str, Any] = {
            "experiment": row.case.experiment,
            "config": row.case.label,
            "system": row.system,
            "status": row.status,
            "reason": row.reason,
            "repeats": len(row.results),
            "env_steps_per_s": row.steps_per_s,
            "env_steps_per_s_all": ";".join(f"{r['env_steps_per_s']:.1f}" for r in row.results),
            "spread": row.spread,
            "seconds_per_iteration": row.median("seconds_per_iteration"),
            "first_iteration_s": row.median("first_iteration_s"),
            "setup_s": row.median("setup_s"),
            "peak_rss_mib": _mib(row.median("peak_rss_bytes")),
            "data_mib": _mib(row.data_bytes),
            "framework_peak_mib": _mib(row.median("framework_peak_bytes")),
            "last_return": row.last_return,
            "algo": row.case.algo,
            "env_id": c.env_id,
            "obs_shape": "x".join(map(str, obs)) if obs else "",
            "num_envs": c.num_envs,
            "num_steps": c.num_steps,
            "hidden_layers": c.hidden_layers,
            "hidden_size": c.hidden_size,
            "epochs": c.epochs,
            "minibatches": c.minibatches,
            "iterations": c.iterations,
            "lr": c.lr,
            "threads": c.threads,
        }
        for b in bases:
            rec[f"ratio_vs_{b}"] = row.ratios.get(b, math.nan)
        records.append(rec)
    return records, CSV_FIELDS + ratio_fields


def write_csv(rows: list[Row], path: Path) -> None:
    records, fields_ = to_records(rows)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields_)
        writer.writeheader()
        for rec in records:
            writer.writerow({k: _fmt_csv(v) for k, v in rec.items()})


def _fmt_csv(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def _num(value: float, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt % value


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def table_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the results table (shared by the console and the markdown file)."""
    bases = baseline_names(rows)
    header = [
        "config",
        "system",
        "env steps/s",
        "spread",
        "s/iter",
        "1st iter ÷ steady",
        "setup s",
        "peak RSS MiB",
        "data MiB",
        "fw peak MiB",
        "return",
    ] + [f"÷ {b}" for b in bases]
    cells = []
    for row in rows:
        if row.status != "ok":
            cells.append([row.case.label, row.system, row.status] + [""] * (len(header) - 3))
            continue
        line = [
            row.case.label,
            row.system,
            f"{row.steps_per_s:,.0f}",
            _num(100 * row.spread, "±%.0f%%"),
            f"{row.median('seconds_per_iteration'):.4f}",
            _num(
                _ratio(row.median("first_iteration_s"), row.median("seconds_per_iteration")),
                "%.2fx",
            ),
            f"{row.median('setup_s'):.2f}",
            f"{_mib(row.median('peak_rss_bytes')):.0f}",
            _num(_mib(row.data_bytes), "%.0f"),
            _num(_mib(row.median("framework_peak_bytes")), "%.1f"),
            _num(row.last_return, "%.1f"),
        ]
        line += [_num(row.ratios.get(b, math.nan), "%.2fx") for b in bases]
        cells.append(line)
    return header, cells


def print_table(rows: list[Row], title: str) -> None:
    header, cells = table_rows(rows)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(markdown_table(header, cells))
        print("\n".join(notes(rows) + budget_lines(rows)))
        return
    table = Table(title=title, show_lines=False)
    for k, name in enumerate(header):
        table.add_column(name, justify="left" if k < 2 else "right", no_wrap=k < 2)
    last = None
    for line in cells:
        if last is not None and line[0] != last:
            table.add_section()
        last = line[0]
        style = "dim" if line[2] in ("skipped", "failed") else None
        table.add_row(*line, style=style)
    console = Console(width=max(160, len(header) * 12))
    console.print(table)
    for line in notes(rows) + budget_lines(rows):
        console.print(line, markup=False, highlight=False)


def notes(rows: list[Row]) -> list[str]:
    """One line per system that did not run, with why (and the cases it concerns)."""
    seen: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if row.status != "ok":
            seen.setdefault((row.system, f"{row.status}: {row.reason}"), []).append(row.case.label)
    return [f"{system} {why} ({', '.join(labels)})" for (system, why), labels in seen.items()]


def markdown_table(header: list[str], cells: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "/") for c in line) + " |" for line in cells]
    return "\n".join(out)


def profile_table(profiles: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = [
        "config",
        "system",
        "compile s",
        "run s",
        "env",
        "kernels",
        "host calls",
        "executor/framework",
        "kernel timers",
        "top kernels (s)",
    ]
    cells = []
    for p in profiles:
        run_s = p["run_s"] or math.nan

        def part(v: float | None, run_s: float = run_s) -> str:
            return "-" if v is None else f"{v:.2f} s ({100 * v / run_s:.0f}%)"

        top = ", ".join(f"{k} {s:.2f}" for k, s, _ in p["top_kernels"][:4])
        cells.append(
            [
                p["case"],
                p["system"],
                _num(p["compile_s"], "%.2f"),
                f"{run_s:.2f}",
                part(p["env_s"]),
                part(p["kernels_s"]),
                part(p.get("host_s")),
                part(p["executor_s"]),
                part(p.get("timers_s")),
                top,
            ]
        )
    return header, cells


def print_profiles(profiles: list[dict[str, Any]]) -> None:
    header, cells = profile_table(profiles)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(markdown_table(header, cells))
        return
    table = Table(title="Where a run's time goes (one instrumented run per system)")
    for k, name in enumerate(header):
        table.add_column(name, justify="left" if k < 2 or k == 8 else "right")
    for line in cells:
        table.add_row(*line)
    Console(width=180).print(table)


def plot(rows: list[Row], out: Path) -> list[Path]:
    """One PNG per experiment: env steps/s and peak RSS per system across its cases."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    experiments: dict[str, list[Row]] = {}
    for row in rows:
        experiments.setdefault(row.case.experiment, []).append(row)
    for name, group in experiments.items():
        ok = [r for r in group if r.status == "ok"]
        if not ok:
            continue
        labels = list(dict.fromkeys(r.case.label for r in group))
        xs = {lab: next(r.case.x for r in group if r.case.label == lab) for lab in labels}
        systems = list(dict.fromkeys(r.system for r in ok))
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        width = 0.8 / max(len(systems), 1)
        for k, sys_name in enumerate(systems):
            for ax, key, scale in (
                (axes[0], "env_steps_per_s", 1.0),
                (axes[1], "peak_rss_bytes", 2**-20),
            ):
                heights = []
                for lab in labels:
                    match = [r for r in ok if r.system == sys_name and r.case.label == lab]
                    heights.append(match[0].median(key) * scale if match else 0.0)
                pos = [j + (k - (len(systems) - 1) / 2) * width for j in range(len(labels))]
                ax.bar(pos, heights, width, label=sys_name)
        axis, what = EXPERIMENTS.get(name, (name, name))
        for ax, ylabel in ((axes[0], "env steps/s (median)"), (axes[1], "peak RSS (MiB)")):
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels([f"{axis}={xs[lab]}" for lab in labels])
            ax.set_ylabel(ylabel)
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{what}\n{axis} varies; otherwise as {group[0].case.describe()}", fontsize=9)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
