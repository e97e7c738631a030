"""Audit of the offline judges (issue 23): do the offline gold and the offline simulated pools measure
real judges, on cases none of them was built from?

    python bench/audit_judges.py [--tools DIR] [--data DIR]

--tools: the bin/ folder of the farmkit install to audit (default: this interpreter's). Cases:
- GPT-4's verdicts on AlpacaFarm's 648 human-evaluation pairs (gpt4_b1_seeds: other instructions and
  other outputs than AlpacaEval's), the majority of its 4 runs: how often each offline pool agrees;
- PandaLM's 999 pairs, the majority of 3 humans: the same;
- how often the offline simulated pool agrees with the offline gold (a rule compared with itself
  agrees far more often than two real judges do: GPT-4 and the humans agree on about 65-70%);
- whether farm-judge-train exists.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gpt4_pairs(data: Path) -> list[dict]:
    runs = [
        json.loads((data / f"alpaca_eval/gpt4_b1_seeds/annotations_seed{s}.json").read_text())
        for s in range(4)
    ]
    pairs = []
    for rows in zip(*runs, strict=True):
        votes = Counter(str(r["preference"]) for r in rows)
        side, count = votes.most_common(1)[0]
        if side in ("1", "2") and count >= 3:
            first = rows[0]
            pairs.append(
                {
                    "instruction": first["instruction"],
                    "input": first.get("input") or "",
                    "output_1": first["output_1"],
                    "output_2": first["output_2"],
                    "truth": int(side),
                }
            )
    return pairs


def human_pairs(data: Path) -> list[dict]:
    pairs = []
    for r in json.loads((data / "human_prefs/pandalm_testset_v1.json").read_text()):
        votes = [r[f"annotator{i}"] for i in (1, 2, 3)]
        for side in (1, 2):
            if votes.count(side) >= 2:
                text = [
                    v if isinstance(v, str) else json.dumps(v)
                    for v in (r["response1"], r["response2"])
                ]
                pairs.append(
                    {
                        "instruction": r["instruction"],
                        "input": r.get("input") or "",
                        "output_1": text[0],
                        "output_2": text[1],
                        "truth": side,
                    }
                )
    return pairs


def annotate(tools: Path, pool: str, pairs: list[dict]) -> list[float | None]:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "pairs.jsonl"
        source.write_text(
            "".join(json.dumps({k: v for k, v in p.items() if k != "truth"}) + "\n" for p in pairs)
        )
        done = subprocess.run(
            [
                str(tools / "farm-annotate"),
                "--pool",
                pool,
                "--no-cache",
                "-q",
                "--seed",
                "3",
                str(source),
            ],
            capture_output=True,
            check=False,
        )
    if done.returncode != 0:
        return []
    return [json.loads(line).get("preference") for line in done.stdout.splitlines()]


def agreement(verdicts: list, truths: list) -> float | None:
    if len(verdicts) != len(truths):
        return None
    score = sum(
        0.5 if v == 1.5 or v is None else float(round(v) == t)
        for v, t in zip(verdicts, truths, strict=True)
    )
    return round(score / len(truths), 4)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", default=str(Path(sys.executable).parent))
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    args = parser.parse_args()
    tools, data = Path(args.tools), Path(args.data)
    cases = {"gpt4_b1": gpt4_pairs(data), "pandalm_humans": human_pairs(data)}
    report: dict = {"tools": str(tools), "cases": {k: len(v) for k, v in cases.items()}}
    for pool in ("gold", "sim_eval_offline", "single_offline"):
        for name, pairs in cases.items():
            verdicts = annotate(tools, pool, pairs)
            report[f"{pool} vs {name}"] = agreement(verdicts, [p["truth"] for p in pairs])
            if pool == "gold":
                report.setdefault("_gold", {})[name] = verdicts
    for name, pairs in cases.items():
        sim = annotate(tools, "sim_eval_offline", pairs)
        gold = report["_gold"][name]
        report[f"sim_eval_offline vs gold on {name}"] = (
            agreement(sim, [round(g) if g is not None else 0 for g in gold]) if gold else None
        )
    del report["_gold"]
    report["farm-judge-train exists"] = (tools / "farm-judge-train").exists()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
