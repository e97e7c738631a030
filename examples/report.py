"""Print the demo's result: the simulated and the gold leaderboard side by side (best simulated win
rate first), then how well the simulated leaderboard predicts the gold one.

    python report.py leaderboard_sim.jsonl leaderboard_gold.jsonl correlation.jsonl
"""

from __future__ import annotations

import sys
from typing import Any

from farmkit.io import read_records


def _cell(row: dict[str, Any] | None) -> str:
    if row is None or row.get("win_rate") is None:
        return "-"
    return f"{row['win_rate']:5.1f} ± {row.get('standard_error') or 0:4.1f}"


def main(sim_path: str, gold_path: str, correlation_path: str) -> None:
    sim = {row["generator"]: row for row in read_records(sim_path)}
    gold = {row["generator"]: row for row in read_records(gold_path)}
    references = sorted({str(row.get("reference", "")) for row in sim.values()} - {""})
    systems = sorted(sim, key=lambda name: -(sim[name].get("win_rate") or 0.0))
    systems += sorted(set(gold) - set(sim))
    header = ("system", "sim win rate", "gold win rate", "n", "avg length")
    lines = [header]
    for name in systems:
        row = sim.get(name) or gold.get(name) or {}
        lines.append((name, _cell(sim.get(name)), _cell(gold.get(name)), str(row.get("n_total", "")),
                      str(row.get("avg_length", ""))))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    against = f" against {', '.join(references)}" if references else ""
    print(f"Win rates (%, ± standard error){against}:")
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    for record in read_records(correlation_path):
        figures = ", ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                            for key, value in record.items()
                            if key in ("n", "spearman", "kendall", "pearson", "r2"))
        print(f"Simulated vs gold leaderboard: {figures}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
