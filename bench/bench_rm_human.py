"""How well a reward model trained with farm-rm-train agrees with real human choices.

Data: Anthropic's HH-RLHF harmless-base test split (../shared/data/human_prefs), 2,312 pairs of full
dialogues (`chosen`, `rejected`) that share every turn but the last assistant reply. Conversion to
preference records (`to_preference`): the shared dialogue before the last "\\n\\nAssistant:" becomes
the instruction (turns kept as "Human: ..." / "Assistant: ..." lines), the two last replies become
output_1 and output_2 in a seeded random order, and `preference` names the position of `chosen`.
Pairs whose dialogues differ before the last reply (5 in this file) are left out.

A seeded sample is split into disjoint training and held-out pairs; farm-rm-train trains on the
first, farm-score scores both replies of the second, and the figure is the share of held-out pairs
where the human-chosen reply gets the higher reward, against chance (0.5) and against a length
heuristic measured on the same pairs. Defaults fit about 10 CPU-minutes on a 2-core machine: the
embedded backbone (SmolLM2-135M) frozen, only the scalar head trained (--train-layers 0), each text
cut to its last 32 tokens (mostly the final reply). Measured with these defaults: 0.545 +- 0.035 on
200 held-out pairs (chance 0.5; "the longer reply wins": 0.43), 8.5 CPU-minutes: not significant (1.3 standard errors). A fuller evaluation (not run here)
would train every weight on most of the file, on a GPU: --train 2000 --eval 300 --train-layers -1 --max-length 512.

    python bench/bench_rm_human.py [--train 300] [--eval 200] [--train-layers 0] [--max-length 32]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = (
    Path(os.environ.get("FARMKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
    / "human_prefs"
    / "hh_rlhf_harmless_base_test.jsonl.gz"
)
LAST_TURN = "\n\nAssistant:"


def to_preference(row: dict, rng: random.Random) -> dict | None:
    """One HH-RLHF pair as a preference record, or None when the two dialogues differ before the end."""
    chosen, rejected = row["chosen"], row["rejected"]
    cut_chosen, cut_rejected = chosen.rfind(LAST_TURN), rejected.rfind(LAST_TURN)
    if cut_chosen < 0 or chosen[:cut_chosen] != rejected[:cut_rejected]:
        return None
    dialogue = (
        chosen[:cut_chosen]
        .strip()
        .replace("\n\nHuman:", "\nHuman:")
        .replace("\n\nAssistant:", "\nAssistant:")
    )
    replies = (
        chosen[cut_chosen + len(LAST_TURN) :].strip(),
        rejected[cut_rejected + len(LAST_TURN) :].strip(),
    )
    chosen_first = rng.random() < 0.5
    output_1, output_2 = replies if chosen_first else replies[::-1]
    return {
        "instruction": dialogue,
        "input": "",
        "output_1": output_1,
        "output_2": output_2,
        "preference": 1 if chosen_first else 2,
        "generator_1": "hh-rlhf",
        "generator_2": "hh-rlhf",
        "annotator": "human (hh-rlhf)",
    }


def read_pairs(seed: int) -> list[dict]:
    import gzip

    rng = random.Random(seed)
    with gzip.open(DATA, "rt") as handle:
        converted = [to_preference(json.loads(line), rng) for line in handle if line.strip()]
    return [record for record in converted if record is not None]


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    executable = Path(sys.executable).parent / name
    result = subprocess.run([str(executable), *args, "-q"], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=300, help="training pairs")
    parser.add_argument("--eval", type=int, default=200, help="held-out pairs")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--train-layers", type=int, default=0, help="-1 trains every weight")
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    if not DATA.exists():
        print(f"skipped: {DATA} is absent", file=sys.stderr)
        return

    pairs = read_pairs(options.seed)
    random.Random(options.seed).shuffle(pairs)
    train, held_out = pairs[: options.train], pairs[options.train : options.train + options.eval]
    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
        outputs = []
        for number, record in enumerate(held_out):
            for position in (1, 2):
                outputs.append(
                    {
                        "instruction": record["instruction"],
                        "output": record[f"output_{position}"],
                        "generator": "hh-rlhf",
                        "pair": number,
                        "position": position,
                    }
                )
        (work / "held_out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in outputs))
        started = time.time()
        tool(
            "farm-rm-train",
            options.model,
            str(work / "train.jsonl"),
            "-o",
            str(work / "rm"),
            "--eval-fraction",
            "0",
            "--train-layers",
            str(options.train_layers),
            "--max-length",
            str(options.max_length),
            "--epochs",
            str(options.epochs),
            "--batch-size",
            str(options.batch_size),
            "--learning-rate",
            str(options.learning_rate),
            "--seed",
            str(options.seed),
        )
        train_seconds = time.time() - started
        started = time.time()
        scored = [
            json.loads(line)
            for line in tool(
                "farm-score", str(work / "rm"), str(work / "held_out.jsonl"), "--batch-size", "16"
            ).stdout.splitlines()
        ]
        score_seconds = time.time() - started
        losses = [
            json.loads(line)["loss"]
            for line in (work / "rm" / "metrics.jsonl").read_text().splitlines()
        ]

    rewards = {(r["pair"], r["position"]): r["reward"] for r in scored}
    agree = [
        (rewards[(i, r["preference"])] > rewards[(i, 3 - r["preference"])])
        for i, r in enumerate(held_out)
    ]
    longer = [
        len(r[f"output_{r['preference']}"]) > len(r[f"output_{3 - r['preference']}"])
        for r in held_out
    ]
    accuracy = sum(agree) / len(agree)
    standard_error = math.sqrt(accuracy * (1 - accuracy) / len(agree))
    longer_accuracy = sum(longer) / len(longer)
    settings = {
        "model": options.model,
        "train_pairs": len(train),
        "held_out_pairs": len(held_out),
        "train_layers": options.train_layers,
        "max_length": options.max_length,
        "epochs": options.epochs,
        "learning_rate": options.learning_rate,
        "first_loss": losses[0],
        "last_loss_mean10": sum(losses[-10:]) / len(losses[-10:]),
        "train_seconds": round(train_seconds),
        "score_seconds": round(score_seconds),
    }
    print(
        json.dumps(
            {
                "benchmark": "rm_human",
                "figure": "held-out agreement with human choices (HH harmless-base)",
                "value": accuracy,
                "unit": "accuracy",
                "peer": "chance",
                "peer_value": 0.5,
                "ratio": accuracy / 0.5,
                "target": "> 1 (above chance)",
                "met": accuracy - 2 * standard_error > 0.5,
                "standard_error": standard_error,
                **settings,
            }
        )
    )
    print(
        json.dumps(
            {
                "benchmark": "rm_human",
                "figure": "agreement of 'the longer reply wins' on the same pairs",
                "value": longer_accuracy,
                "unit": "accuracy",
                "peer": "reward model",
                "peer_value": accuracy,
                "ratio": accuracy / longer_accuracy,
                "target": "reward model above the heuristic",
                "met": accuracy > longer_accuracy,
            }
        )
    )


if __name__ == "__main__":
    main()
