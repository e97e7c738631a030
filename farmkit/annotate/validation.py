"""Training pairs for learned judges and their validation with systems held out.

Pairs come from farmkit preference records (and what read_records converts: TRL rows, hh-rlhf), or
from AlpacaEval's compact annotations joined to the outputs they judged. Validation holds whole
systems out (k folds over systems, never over rows, so a judge cannot learn a system's style and
grade it by that): held-out pairwise agreement, and the Spearman correlation between the held-out
systems' predicted win rates and a published leaderboard. Human agreement is measured on pairs with
several human labels (PandaLM's test set: the majority of three).

Definitions. A held-out pair is agreed with when the judge's margin r(output_2) - r(output_1) has the
sign of target - 0.5 (ties left out). A system's predicted win rate is the share of its pairs where
r(output_2) > r(output_1) with the system in position 2 (ties a half), as a deterministic judge's
verdicts give it (`spearman`); `spearman_soft` uses the mean of sigmoid(r(output_2) - r(output_1)).
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from farmkit.annotate.learned import KIND, Features, JudgeConfig, Pair, config_dict, fit
from farmkit.core.fields import EXISTING_FILE, help_field
from farmkit.core.io import FarmError, RecordError, display_name, iter_rows
from farmkit.core.values import NON_NEGATIVE


def _target(preference: Any, source: str, number: int) -> float | None:
    """P(output_2 preferred) from an AlpacaEval/farmkit preference: 1 -> 0, 2 -> 1, 1.5 or the legacy
    0 -> 0.5, fractional values in between, null -> None."""
    from farmkit.core.records import preference_target

    if preference is not None and (
        isinstance(preference, bool) or not isinstance(preference, int | float)
    ):
        raise RecordError(source, number, f"preference {preference!r} is not a number in [1, 2]")
    try:
        return preference_target(preference)
    except ValueError as error:
        raise RecordError(
            source, number, f"{error}; expected 1, 2, 1.5 or a value between"
        ) from None


def is_compact_annotation(record: dict[str, Any]) -> bool:
    """AlpacaEval's compact annotations: lengths kept, output texts removed."""
    return "instruction_index" in record and "output_2" not in record


def records_pairs(rows: Iterable[tuple[int, Any]], source: str) -> list[Pair]:
    """Pairs from preference records (read as read_records reads them; TRL rows converted)."""
    from farmkit.core.io import check_rows
    from farmkit.core.records import pair_texts

    pairs = []
    for number, record in enumerate(check_rows(rows, source, "preference"), start=1):
        texts = pair_texts(record, source, number)
        target = _target(record.get("preference"), source, number)
        if target is None:
            continue
        pairs.append(
            Pair(
                *texts,
                target,
                str(record.get("generator_2") or record.get("generator") or ""),
            )
        )
    return pairs


def _outputs_by_instruction(folder: Path, generator: str) -> dict[str, str]:
    path = folder / "model_outputs" / f"{generator}.jsonl.gz"
    if not path.is_file():
        return {}
    return {
        record["instruction"]: record["output"]
        for _, record in iter_rows(path)
        if isinstance(record, dict) and isinstance(record.get("output"), str)
    }


def alpaca_eval_pairs(
    rows: Iterable[tuple[int, Any]], source: str, folder: str | os.PathLike
) -> tuple[list[Pair], dict[str, int]]:
    """Pairs from AlpacaEval's compact annotations, joined to the outputs they judged in `folder`
    (AlpacaEval's data folder: eval_set.jsonl and model_outputs/<generator>.jsonl.gz), on the
    instruction. Rows whose generator_2 is not their results_dir (upstream copies), null verdicts and
    rows without both outputs are left out and counted."""
    folder = Path(folder)
    eval_set = folder / "eval_set.jsonl"
    if not eval_set.is_file():
        raise FarmError(f"{folder}: no eval_set.jsonl (expected AlpacaEval's data folder)")
    instructions = [record["instruction"] for _, record in iter_rows(eval_set)]
    outputs: dict[str, dict[str, str]] = {}
    pairs: list[Pair] = []
    counts = {"used": 0, "mislabelled": 0, "null": 0, "no_outputs": 0}
    for number, record in rows:
        if not isinstance(record, dict) or not is_compact_annotation(record):
            raise RecordError(
                source,
                number,
                "expected an AlpacaEval annotation (instruction_index, generator_1/2)",
            )
        try:
            index = int(record["instruction_index"])
            generator_1, generator_2 = record["generator_1"], record["generator_2"]
        except (KeyError, TypeError, ValueError) as error:
            raise RecordError(
                source, number, f"expected {error} in an AlpacaEval annotation"
            ) from None
        if record.get("results_dir", generator_2) != generator_2:
            counts["mislabelled"] += 1
            continue
        target = _target(record.get("preference"), source, number)
        if target is None:
            counts["null"] += 1
            continue
        if not 0 <= index < len(instructions):
            raise RecordError(source, number, f"instruction_index {index} is not in {eval_set}")
        instruction = instructions[index]
        for generator in (generator_1, generator_2):
            if generator not in outputs:
                outputs[generator] = _outputs_by_instruction(folder, generator)
        answer_1 = outputs[generator_1].get(instruction)
        answer_2 = outputs[generator_2].get(instruction)
        if answer_1 is None or answer_2 is None:
            counts["no_outputs"] += 1
            continue
        counts["used"] += 1
        pairs.append(Pair(instruction, "", answer_1, answer_2, target, generator_2))
    return pairs, counts


def read_pairs(path: str, alpaca_eval: str | None) -> tuple[list[Pair], dict[str, int]]:
    """Training pairs from any preference file: compact AlpacaEval annotations (joined to the outputs
    in `alpaca_eval`) or preference records."""
    source = display_name(path)
    rows = iter(iter_rows(path))
    first = next(rows, None)
    if first is None:
        return [], {"used": 0}
    from itertools import chain

    rows = chain([first], rows)
    if isinstance(first[1], dict) and is_compact_annotation(first[1]):
        if alpaca_eval is None:
            raise FarmError(
                f"{source}: AlpacaEval annotations hold no output texts; give --alpaca-eval DIR "
                "(AlpacaEval's data folder with eval_set.jsonl and model_outputs/)"
            )
        return alpaca_eval_pairs(rows, source, alpaca_eval)
    pairs = records_pairs(rows, source)
    return pairs, {"used": len(pairs)}


def read_leaderboard(path: str | os.PathLike) -> dict[str, float]:
    """generator -> win_rate from a published AlpacaEval leaderboard (CSV) or farm-winrate rows."""
    path = Path(path)
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        name = next(iter(rows[0])) if rows else ""
        try:
            return {row.get("generator") or row[name]: float(row["win_rate"]) for row in rows}
        except (KeyError, ValueError) as error:
            raise FarmError(
                f"{path}: expected a leaderboard with a win_rate column ({error})"
            ) from None
    board = {}
    for number, row in iter_rows(path):
        if not isinstance(row, dict) or "generator" not in row or "win_rate" not in row:
            raise RecordError(display_name(path), number, "expected generator and win_rate")
        board[row["generator"]] = float(row["win_rate"])
    return board


def _text(value: Any) -> str:
    """A response as text (a few of PandaLM's responses are JSON values: true, numbers)."""
    return value if isinstance(value, str) else json.dumps(value)


def human_pairs(path: str | os.PathLike) -> list[tuple[str, str, str, str, int]]:
    """(instruction, input, response1, response2, majority) from PandaLM's test set, where at least two
    of the three human labels agree on a winner (ties and split votes left out)."""
    try:
        records = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise FarmError(f"{path}: cannot read the human labels ({error})") from None
    pairs = []
    for record in records:
        votes = [record.get(f"annotator{i}") for i in (1, 2, 3)]
        for side in (1, 2):
            if votes.count(side) >= 2:
                pairs.append(
                    (
                        record["instruction"],
                        record.get("input") or "",
                        _text(record["response1"]),
                        _text(record["response2"]),
                        side,
                    )
                )
    return pairs


def _spearman(x: Sequence[float], y: Sequence[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def agreement(margins: np.ndarray, targets: np.ndarray) -> float:
    decided = (targets != 0.5) & (margins != 0)
    return float(np.mean((margins[decided] > 0) == (targets[decided] > 0.5)))


def system_folds(systems: Sequence[str], folds: int, seed: int) -> list[list[str]]:
    names = sorted(set(systems))
    random.Random(seed).shuffle(names)
    return [names[i::folds] for i in range(folds)]


def held_out(
    pairs: Sequence[Pair],
    config: JudgeConfig,
    folds: int,
    seed: int,
    leaderboard: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Held-out figures of a judge built with `config`, systems held out `folds` ways."""
    systems = [p.system for p in pairs]
    if len(set(systems)) < folds:
        raise FarmError(
            f"holding systems out {folds} ways needs at least {folds} systems "
            f"(found {len(set(systems))}; pairs name their system in generator_2)"
        )
    margins = np.zeros(len(pairs))
    features = Features(pairs, config)
    for fold in system_folds(systems, folds, seed):
        out = set(fold)
        train = [i for i, p in enumerate(pairs) if p.system not in out]
        test = np.array([i for i, p in enumerate(pairs) if p.system in out])
        judge = fit(features, config, train)
        margins[test] = judge.margins(features, test)
    targets = np.array([p.target for p in pairs])
    decided = targets != 0.5
    figures: dict[str, Any] = {
        "folds": folds,
        "systems": len(set(systems)),
        "pairs": len(pairs),
        "agreement": round(agreement(margins, targets), 4),
        "base_rate": round(
            float(max(np.mean(targets[decided] > 0.5), np.mean(targets[decided] < 0.5))), 4
        ),
    }
    if leaderboard:
        soft: dict[str, list[float]] = defaultdict(list)
        hard: dict[str, list[float]] = defaultdict(list)
        for p, m in zip(pairs, margins, strict=True):
            soft[p.system].append(1.0 / (1.0 + math.exp(-m)))
            hard[p.system].append(0.5 if m == 0 else float(m > 0))
        ranked = sorted(s for s in soft if s in leaderboard)
        if len(ranked) >= 3:
            published = [leaderboard[s] for s in ranked]
            # hard verdicts: what a deterministic (temperature 0) judge's win rates give
            figures["spearman"] = round(_spearman([np.mean(hard[s]) for s in ranked], published), 4)
            figures["spearman_soft"] = round(
                _spearman([np.mean(soft[s]) for s in ranked], published), 4
            )
            figures["spearman_systems"] = len(ranked)
    return figures


def human_agreement(score: Any, pairs: Sequence[tuple[str, str, str, str, int]]) -> float:
    """Share of human-majority pairs where `score` (texts -> rewards) prefers the majority's side
    (an exact tie counts a half)."""
    rewards = score([(i, x, a) for i, x, a, _, _ in pairs] + [(i, x, b) for i, x, _, b, _ in pairs])
    count = len(pairs)
    hits = 0.0
    for k, (*_, majority) in enumerate(pairs):
        margin = rewards[count + k] - rewards[k]
        hits += 0.5 if margin == 0 else float((margin > 0) == (majority == 2))
    return round(hits / count, 4)


@dataclass
class JudgeTrainConfig:
    """farm-judge-train's settings besides the judge's own (JudgeConfig): where the pairs come
    from, and how the judge is validated."""

    alpaca_eval: str | None = help_field(
        None,
        "AlpacaEval's data folder (eval_set.jsonl, model_outputs/): joins compact AlpacaEval annotations to the outputs they judged.",
        path={"exists": True, "file_okay": False},
        show_default=False,
    )
    leaderboard: str | None = help_field(
        None,
        "The published leaderboard of the judge PREFS come from (AlpacaEval CSV or farm-winrate rows): held-out systems' predicted win rates are ranked against it (Spearman).",
        path=EXISTING_FILE,
        show_default=False,
    )
    human: str | None = help_field(
        None,
        "Pairs with three human labels (PandaLM's test set JSON): agreement with the human majority, beside length alone and the heuristic gold.",
        path=EXISTING_FILE,
        show_default=False,
    )
    folds: int = help_field(
        5,
        "Validate holding systems out this many ways (k-fold over generator_2, never over rows); 0 or 1 skips validation.",
        bounds=NON_NEGATIVE,
    )
    data_license: str | None = help_field(
        None,
        "License of PREFS, recorded in meta.json (default: CC BY-NC 4.0 for AlpacaEval annotations, else unknown).",
        flags=("--license",),
        show_default=False,
    )
    source: str | None = help_field(
        None, "Where PREFS come from, recorded in meta.json.", show_default=False
    )


def train_judge(
    pairs: Sequence[Pair],
    output: str | os.PathLike,
    config: JudgeConfig,
    *,
    folds: int = 5,
    seed: int = 0,
    leaderboard: str | None = None,
    human: str | None = None,
    data: dict[str, Any] | None = None,
    inputs: Sequence[str] = (),
) -> dict[str, Any]:
    """Validate a judge with systems held out (folds > 1), fit it on every pair, measure it (and
    length alone, and the heuristic gold) on human labels, and write the judge folder `output`
    whole. Returns meta.json."""
    from farmkit.annotate.oracle import gold_reward
    from farmkit.lm.modelio import model_folder, model_meta
    from farmkit.lm.models import write_meta

    board = read_leaderboard(leaderboard) if leaderboard else None
    validation: dict[str, Any] = {}
    if folds > 1:
        validation["judge"] = held_out(pairs, config, folds, seed, board)
        length = JudgeConfig(**{**config_dict(config), "features": "length"})
        validation["length_alone"] = held_out(pairs, length, folds, seed, board)
    judge = fit(pairs, config)
    if human:
        labelled = human_pairs(human)
        validation["human"] = {
            "file": Path(human).name,
            "pairs": len(labelled),
            "judge": human_agreement(judge.score, labelled),
            "length_alone": human_agreement(
                lambda texts: [len(t[2].split()) for t in texts], labelled
            ),
            "heuristic_gold": human_agreement(
                lambda texts: [gold_reward(*t) for t in texts], labelled
            ),
        }
    meta = model_meta(
        "farm-judge-train",
        KIND,
        "none",
        "none",
        seed,
        config_dict(config),
        list(inputs),
        data=data,
        pairs=len(pairs),
        systems=len({p.system for p in pairs}),
        validation=validation,
        launch={},
    )
    with model_folder(output) as folder:
        judge.save(folder)
        write_meta(folder, meta)
    return meta
