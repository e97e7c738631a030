"""farm-judge-train and learned judges: the fit, the judge folder, the tool's I/O errors, the oracle
backend reading a learned judge, the shipped offline judges, and (with ../shared/data) a judge
learned from GPT-4's AlpacaEval verdicts that beats length alone on systems it never saw."""

from __future__ import annotations

import asyncio
import gzip
import json
import random

import numpy as np
import orjson
import pytest
from conftest import run_tool, shared_data

from farmkit.annotate.learned import JudgeConfig, Pair, fit, judge_folder, load_judge
from farmkit.annotate.validation import held_out, read_pairs

GOOD = ["The answer, explained step by step with care.", "Here is a clear and careful answer."]
BAD = ["dunno lol", "whatever, figure it out"]


def _synthetic_pairs(count: int, systems: int = 6, seed: int = 0) -> list[dict]:
    """Preference records where a careful answer beats a dismissive one, whatever its position, with
    both kinds of length (so only the words tell them apart)."""
    rng = random.Random(seed)
    records = []
    for number in range(count):
        good, bad = rng.choice(GOOD), rng.choice(BAD)
        if rng.random() < 0.5:
            bad = f"{bad} {bad} {bad} {bad} {bad}"
        first_good = rng.random() < 0.5
        records.append(
            {
                "instruction": f"Question {number}?",
                "output_1": good if first_good else bad,
                "output_2": bad if first_good else good,
                "generator_2": f"system-{number % systems}",
                "preference": 1 if first_good else 2,
            }
        )
    return records


def _write_jsonl(path, records) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def test_fit_learns_which_answer_is_better():
    pairs = [
        Pair(r["instruction"], "", r["output_1"], r["output_2"], r["preference"] - 1.0, "s")
        for r in _synthetic_pairs(200)
    ]
    judge = fit(pairs, JudgeConfig(buckets=2**12))
    good, bad = judge.score([("Q?", "", GOOD[0]), ("Q?", "", BAD[0])])
    assert good > bad + 1.0


def test_held_out_figures_hold_systems_out():
    pairs = [
        Pair(
            r["instruction"],
            "",
            r["output_1"],
            r["output_2"],
            r["preference"] - 1.0,
            r["generator_2"],
        )
        for r in _synthetic_pairs(300)
    ]
    figures = held_out(pairs, JudgeConfig(buckets=2**12), folds=3, seed=0)
    assert figures["systems"] == 6 and figures["folds"] == 3
    assert figures["agreement"] > 0.95
    # length alone cannot tell these answers apart (both kinds come short and long)
    length = held_out(pairs, JudgeConfig(buckets=2**12, features="length"), folds=3, seed=0)
    assert length["agreement"] < 0.7


def test_tool_writes_a_judge_folder_the_oracle_loads(tmp_path):
    prefs = tmp_path / "prefs.jsonl"
    _write_jsonl(prefs, _synthetic_pairs(240))
    folder = tmp_path / "judge"
    done = run_tool(
        "farm-judge-train", str(prefs), "-o", str(folder), "--folds", "3", "--buckets", "4096"
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b""
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "weights.npz"]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["kind"] == "learned_judge" and meta["tool"] == "farm-judge-train"
    assert meta["pairs"] == 240 and meta["systems"] == 6
    assert meta["data"]["license"] == "unknown" and meta["data"]["file"] == str(prefs)
    assert set(meta["validation"]) == {"judge", "length_alone"}
    assert (
        meta["validation"]["judge"]["agreement"] > meta["validation"]["length_alone"]["agreement"]
    )
    assert not list(tmp_path.glob(".judge.partial"))
    assert meta["config"]["buckets"] == 4096

    from farmkit.annotate.oracle import OracleBackend
    from farmkit.annotate.pools import Judge, Pool
    from farmkit.annotate.prompts import Shown

    judge = Judge(name="learned", backend="oracle", reward=str(folder))
    backend = OracleBackend(Pool(name="learned", description="", judges=[judge]), {})
    rewards = backend.rewards(str(folder), [("Q?", "", GOOD[1]), ("Q?", "", BAD[1])])
    assert rewards == pytest.approx(
        load_judge(str(folder)).score([("Q?", "", GOOD[1]), ("Q?", "", BAD[1])])
    )
    assert rewards[0] > rewards[1]
    shown = [Shown("Q?", "", BAD[1], GOOD[1]), Shown("Q?", "", GOOD[0], BAD[0])]
    verdicts = asyncio.run(backend.judge(judge, shown, [0.5, 0.5], seed=0))
    assert [v.choice for v in verdicts] == ["B", "A"]

    # the folder itself is a pool (farm-annotate --pool FOLDER) and a gold judge (--gold FOLDER)
    from farmkit.train.gold import judge_kind

    assert judge_kind(str(folder)) == "pool"
    pairs = [
        {"instruction": "Q?", "output_1": BAD[1], "output_2": GOOD[1]},
        {"instruction": "R?", "output_1": GOOD[0], "output_2": BAD[0]},
    ]
    annotated = run_tool(
        "farm-annotate",
        "--pool",
        str(folder),
        "--no-cache",
        input=b"".join(orjson.dumps(p) + b"\n" for p in pairs),
    )
    assert annotated.returncode == 0, annotated.stderr.decode()
    records = [orjson.loads(line) for line in annotated.stdout.splitlines()]
    assert [r["preference"] for r in records] == [2, 1]
    assert {r["annotator"] for r in records} == {"judge"}


def test_tool_names_the_file_and_line_of_a_bad_record(tmp_path):
    prefs = tmp_path / "prefs.jsonl"
    records = _synthetic_pairs(4)
    text = b"".join(orjson.dumps(r) + b"\n" for r in records[:2]) + b'{"instruction": "x"\n'
    prefs.write_bytes(text)
    done = run_tool("farm-judge-train", str(prefs), "-o", str(tmp_path / "judge"), "--folds", "0")
    assert done.returncode == 1
    assert f"{prefs}:3" in done.stderr.decode()
    assert b"Traceback" not in done.stderr
    assert not (tmp_path / "judge").exists()


def test_tool_rejects_a_preference_out_of_range(tmp_path):
    prefs = tmp_path / "prefs.jsonl"
    records = _synthetic_pairs(3)
    records[1]["preference"] = 7
    _write_jsonl(prefs, records)
    done = run_tool("farm-judge-train", str(prefs), "-o", str(tmp_path / "judge"), "--folds", "0")
    assert done.returncode == 1
    assert f"{prefs}:2" in done.stderr.decode() and "preference" in done.stderr.decode()
    assert not (tmp_path / "judge").exists()


def test_compact_annotations_need_their_outputs_and_name_bad_lines(tmp_path):
    folder = tmp_path / "alpaca_eval"
    (folder / "model_outputs").mkdir(parents=True)
    (folder / "eval_set.jsonl").write_text('{"instruction": "Q?"}\n')
    for generator, output in (("ref", "Short."), ("sys", "A longer, careful answer.")):
        with gzip.open(folder / "model_outputs" / f"{generator}.jsonl.gz", "wt") as handle:
            handle.write(
                json.dumps({"instruction": "Q?", "output": output, "generator": generator}) + "\n"
            )
    row = {"results_dir": "sys", "instruction_index": 0, "generator_1": "ref", "generator_2": "sys"}
    annotations = tmp_path / "annotations.jsonl"
    _write_jsonl(annotations, [{**row, "preference": 2}, {**row, "preference": "two"}])
    done = run_tool(
        "farm-judge-train", str(annotations), "-o", str(tmp_path / "judge"), "--folds", "0"
    )
    assert done.returncode == 1 and b"--alpaca-eval" in done.stderr
    done = run_tool(
        "farm-judge-train",
        str(annotations),
        "--alpaca-eval",
        str(folder),
        "-o",
        str(tmp_path / "j"),
        "--folds",
        "0",
    )
    assert done.returncode == 1
    assert f"{annotations}:2" in done.stderr.decode()
    _write_jsonl(
        annotations, [{**row, "preference": 2}, {**row, "results_dir": "other", "preference": 1}]
    )
    pairs, counts = read_pairs(str(annotations), str(folder))
    assert counts == {"used": 1, "mislabelled": 1, "null": 0, "no_outputs": 0}
    assert pairs[0].output_2 == "A longer, careful answer." and pairs[0].target == 1.0


def test_shipped_judges_load_and_the_heuristic_stays_a_named_pool():
    from farmkit.annotate.pools import load_pool

    gold = load_pool("gold")
    assert [j.reward for j in gold.judges] == ["gpt4"]
    judge = load_judge("gpt4")
    assert judge is not None
    for name, license_ in (
        ("gpt4", "CC BY-NC 4.0"),
        ("gpt4_turbo", "CC BY-NC 4.0"),
        ("humans", "Apache-2.0"),
    ):
        meta = json.loads((judge_folder(name) / "meta.json").read_text())
        assert meta["kind"] == "learned_judge" and meta["data"]["license"] == license_, name
        assert meta["data"]["source"], name
        assert (judge_folder(name) / "weights.npz").stat().st_size < 2_000_000, name
    validation = json.loads((judge_folder("gpt4") / "meta.json").read_text())["validation"]
    assert validation["judge"]["agreement"] > validation["length_alone"]["agreement"]
    assert validation["judge"]["spearman"] > validation["length_alone"]["spearman"]
    assert [j.reward for j in load_pool("gold_heuristic").judges] == ["heuristic"]
    for name in ("sim_eval_offline", "sim_ann_offline", "single_offline"):
        rewards = {j.reward for j in load_pool(name).judges}
        assert "gpt4" not in rewards and "heuristic" not in rewards, name
        for reward in rewards:
            assert load_judge(reward) is not None, reward


@pytest.mark.heavy
def test_judge_learned_from_gpt4_beats_length_on_held_out_systems():
    """A small judge from real GPT-4 verdicts (12 systems, 3 folds over systems): its held-out pairwise
    agreement beats length alone's."""
    annotations = shared_data("alpaca_eval/annotations/alpaca_eval_gpt4.jsonl.gz")
    pairs, _ = read_pairs(str(annotations), str(annotations.parent.parent))
    systems = sorted({p.system for p in pairs})
    keep = set(random.Random(0).sample(systems, 12))
    pairs = [p for p in pairs if p.system in keep]
    config = JudgeConfig(buckets=2**16)
    judge = held_out(pairs, config, folds=3, seed=0)
    length = held_out(pairs, JudgeConfig(buckets=2**16, features="length"), folds=3, seed=0)
    assert judge["systems"] == 12
    assert judge["agreement"] > length["agreement"] + 0.01, (judge, length)
    assert np.isfinite(judge["agreement"])


@pytest.mark.parametrize("l2", [float("nan"), float("inf"), -1.0])
def test_a_learned_judges_ridge_penalty_is_a_finite_number(l2):
    from farmkit.annotate.learned import JudgeConfig

    with pytest.raises(ValueError, match="l2: .* is not a finite number >= 0"):
        JudgeConfig(l2=l2)
