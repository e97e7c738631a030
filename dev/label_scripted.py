"""A scripted labelling run through farm-label's page in a real Chromium (issue 34's "done when"):
three annotators with known error rates label the same pairs (`--overlap 1`), by clicks and keys, so
that the agreement `farm-correlate --humans` reports can be checked against what the rates imply.

    python -m dev.label_scripted OUT [--pairs 40] [--error-rates 0.1,0.2,0.35] [--seed 0]
                                     [--screenshot docs/img/farm-label.png]

The pairs come from examples/data/instructions.jsonl: a demonstration (the truth's better output)
against the demonstration of another instruction of the same task (a plausible wrong answer), in a
seeded order. An annotator with error rate e answers the wrong side on round(e * N) pairs drawn at
random (seeded), the better side on the others ("much" or "slightly" better, drawn), never a tie.
Two such annotators agree on a pair with probability (1 - e1)(1 - e2) + e1 e2.

OUT gets pairs.jsonl, truth.jsonl (the pairs with the true `preference`), labels.jsonl (farm-label's
-o) and summary.json (realised error rates, expected and realised pairwise agreement).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import tempfile
from pathlib import Path

from dev.browser import (
    LabelServer,
    act,
    choose,
    open_browser,
    open_page,
    page_state,
    plain,
    press,
    shown_text,
)

ROOT = Path(__file__).resolve().parent.parent
INSTRUCTIONS = ROOT / "examples" / "data" / "instructions.jsonl"
KEYS = {"A_much": "1", "A_slightly": "2", "tie": "3", "B_slightly": "4", "B_much": "5"}


def make_pairs(count: int, rng: random.Random) -> list[dict]:
    """COUNT pairs with their true preference: a demonstration against another one of its task."""
    records = [json.loads(line) for line in INSTRUCTIONS.read_text().splitlines()]
    by_task: dict[str, list[dict]] = {}
    for record in records:
        by_task.setdefault(record["task"], []).append(record)
    pairs = []
    for record in rng.sample(records, count):
        wrong = rng.choice([r for r in by_task[record["task"]] if r["output"] != record["output"]])
        good_first = rng.random() < 0.5
        outputs = (record["output"], wrong["output"])
        pairs.append(
            {
                "id": record["id"],
                "instruction": record["instruction"],
                "input": record["input"],
                "output_1": outputs[0] if good_first else outputs[1],
                "output_2": outputs[1] if good_first else outputs[0],
                "generator_1": "demonstration" if good_first else "other",
                "generator_2": "other" if good_first else "demonstration",
                "preference": 1 if good_first else 2,
            }
        )
    return pairs


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pair_key(record: dict) -> tuple:
    return record["instruction"], record.get("input") or "", record["output_1"], record["output_2"]


def choice_for(screen: dict, truth: dict, wrong: bool, rng: random.Random) -> str:
    """The button a scripted annotator presses on SCREEN: the better side, or the worse if WRONG."""
    better = truth["output_1"] if truth["preference"] == 1 else truth["output_2"]
    left_better = plain(screen["left"]) == shown_text(better)
    side = "A" if left_better != wrong else "B"
    return f"{side}_{rng.choice(['much', 'slightly'])}"


def label_all(driver, link: str, truths: dict, flipped: set, rng: random.Random, shot) -> None:
    """Answer every pair the page shows, by keys and clicks in turn, until it says all done."""
    state = open_page(driver, link)
    answered = 0
    while not state["done"]:
        if shot is not None and answered == len(truths) // 6:  # a third of the way (both orders)
            shot(driver)
            shot = None
        shown = (state["instruction"], state["input"] or "", plain(state["left"]))
        truth = truths[(*shown, plain(state["right"]))]
        choice = choice_for(state, truth, pair_key(truth) in flipped, rng)
        state = act(driver, press(KEYS[choice]) if answered % 2 else choose(choice))
        if state["error"]:
            raise RuntimeError(f"the page showed an error: {state['error']}")
        answered += 1


def screenshot_to(path: Path):
    def shot(driver) -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        # the pointer away from the buttons, whose hover tint would look like an answer
        ActionChains(driver).move_to_element(driver.find_element("css selector", "h1")).perform()
        path.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(path))
        print(f"screenshot: {path} ({page_state(driver)['progress']})")

    return shot


def agreement(labels: list[dict], first: str, second: str) -> float:
    by_pair = {(label["annotator"], pair_key(label)): label["preference"] for label in labels}
    shared = [key for name, key in by_pair if name == first and (second, key) in by_pair]
    return sum(by_pair[(first, key)] == by_pair[(second, key)] for key in shared) / len(shared)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--error-rates", default="0.1,0.2,0.35")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--screenshot", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rates = {
        f"annotator-{number}": float(rate)
        for number, rate in enumerate(args.error_rates.split(","), 1)
    }
    names = list(rates)

    args.out.mkdir(parents=True, exist_ok=True)
    truth_records = make_pairs(args.pairs, rng)
    write_jsonl(args.out / "truth.jsonl", truth_records)
    write_jsonl(
        args.out / "pairs.jsonl",
        [{k: v for k, v in record.items() if k != "preference"} for record in truth_records],
    )
    # what the page shows (instruction, input, left, right) -> the pair, in either order
    truths = {}
    for record in truth_records:
        for left, right in itertools.permutations((record["output_1"], record["output_2"])):
            truths[
                (record["instruction"], record["input"], shown_text(left), shown_text(right))
            ] = record
    flipped = {
        name: {pair_key(r) for r in rng.sample(truth_records, round(rate * args.pairs))}
        for name, rate in rates.items()
    }

    server_args = ["--annotators", ",".join(names), "--overlap", "1", "--seed", str(args.seed)]
    # a fresh -o each run; farm-label's own files beside it (the links' tokens) stay out of OUT
    with tempfile.TemporaryDirectory() as scratch:
        labels_path = Path(scratch) / "labels.jsonl"
        with LabelServer(
            args.out / "pairs.jsonl", "-o", labels_path, *server_args, "--port", "0"
        ) as server:
            for number, name in enumerate(names):
                shot = screenshot_to(args.screenshot) if args.screenshot and number == 0 else None
                with open_browser() as driver:
                    label_all(driver, server.links[name], truths, flipped[name], rng, shot)
        shutil.copyfile(labels_path, args.out / "labels.jsonl")

    labels = read_jsonl(args.out / "labels.jsonl")
    true_preference = {pair_key(record): record["preference"] for record in truth_records}
    summary = {"pairs": args.pairs, "annotators": {}, "pairwise_agreement": {}}
    for name, rate in rates.items():
        own = [label for label in labels if label["annotator"] == name]
        errors = sum(label["preference"] != true_preference[pair_key(label)] for label in own)
        summary["annotators"][name] = {
            "error_rate": rate,
            "labels": len(own),
            "realised_error_rate": errors / len(own),
            "slightly": sum(label["strength"] == "slightly" for label in own) / len(own),
        }
    for (first, rate_1), (second, rate_2) in itertools.combinations(rates.items(), 2):
        summary["pairwise_agreement"][f"{first} / {second}"] = {
            "expected": round((1 - rate_1) * (1 - rate_2) + rate_1 * rate_2, 4),
            "realised": agreement(labels, first, second),
        }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
