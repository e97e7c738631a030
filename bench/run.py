"""Run every benchmark in bench/ (bench_*.py) and print one table of figures as ratios.

Each benchmark is a script that prints JSON lines on stdout, one per figure:
    {"benchmark": "...", "figure": "...", "value": 123.0, "unit": "records/s",
     "peer": "pandas", "peer_value": 45.0, "ratio": 2.7, "target": ">= 2", "met": true}
`ratio` is value / peer_value (or the figure against its limit), measured in the same run.
`python bench/run.py NAME...` runs only the named benchmarks (bench_NAME.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in names]
    rows, failed = [], []
    for script in scripts:
        started = time.time()
        print(f"running {script.name} ...", file=sys.stderr, flush=True)
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        if result.returncode != 0:
            failed.append(script.name)
            print(result.stderr[-3000:], file=sys.stderr)
            continue
        for line in result.stdout.splitlines():
            if line.strip().startswith("{"):
                rows.append(json.loads(line))
        print(f"  done in {time.time() - started:.0f} s", file=sys.stderr)
    header = ("benchmark", "figure", "value", "peer / limit", "ratio", "target", "met")
    table = [header]
    for row in rows:
        peer = row.get("peer", "")
        if row.get("peer_value") is not None:
            peer = f"{peer} {row['peer_value']:.4g}"
        table.append(
            (
                row["benchmark"],
                row["figure"],
                f"{row['value']:.4g} {row.get('unit', '')}".strip(),
                peer,
                f"{row['ratio']:.3g}" if row.get("ratio") is not None else "",
                row.get("target", ""),
                {True: "yes", False: "NO", None: ""}[row.get("met")],
            )
        )
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
