"""A per-family summary of a built corpus, as rows and as a markdown table."""

from __future__ import annotations

from timerl.graphopt.corpus.split import SPLITS

_KINDS = ("model", "training", "program", "synthetic")


def summary_rows(entries: list[dict]) -> list[dict]:
    """One row per (split, family, kind): graph count and smallest/largest node count."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for e in entries:
        groups.setdefault((e["split"], e["family"], e["kind"]), []).append(e["nodes"])
    rows = [
        {"family": f, "kind": k, "split": s, "count": len(n), "min": min(n), "max": max(n)}
        for (s, f, k), n in groups.items()
    ]
    rows.sort(key=lambda r: (SPLITS.index(r["split"]), r["family"], _KINDS.index(r["kind"])))
    return rows


def summary_markdown(entries: list[dict]) -> str:
    """The summary as a markdown table, with a total line."""
    lines = ["| family | kind | split | graphs | nodes |", "|---|---|---|---|---|"]
    for r in summary_rows(entries):
        span = f"{r['min']:,}" if r["min"] == r["max"] else f"{r['min']:,}-{r['max']:,}"
        lines.append(f"| {r['family']} | {r['kind']} | {r['split']} | {r['count']} | {span} |")
    nodes = [e["nodes"] for e in entries]
    if nodes:
        lines.append(f"| **all** | | | **{len(entries)}** | {min(nodes):,}-{max(nodes):,} |")
    return "\n".join(lines)
