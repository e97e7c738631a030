"""--gold: a second judge scores each checkpoint of every policy method, and the figures in
metrics.jsonl are that judge's. In the keyword world of policy_fixtures the surrogate reward model
pays for "blue" and the gold one for "red": the two disagree on every colour answer, so a gold column
that came from the surrogate (or from the method's own reward) would read differently. Each test
spies on the gold judge, counts its calls and recomputes its figures from the answers it was shown:
RLOO (every checkpoint), DPO (its end) and best-of-n (every n, through an annotator pool whose
oracle judge is the red reward model). Each also checks the run's budget (farmkit.train.budget)."""

from __future__ import annotations

import importlib
import json
import math
import shutil
import statistics

import pytest
import tomllib
import torch
from click.testing import CliRunner
from conftest import ROOT
from policy_fixtures import (
    COLOURS,
    KEYWORD,
    QUESTIONS,
    check_budget,
    keyword_reward_model,
    prompt_records,
    tiny_sft,
    write_jsonl,
)

from farmkit.core.io import FarmError
from farmkit.train import gold as gold_module
from farmkit.train.scoring import RewardScorer

GOLD_COLOUR = "red"
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
POLICY_METHODS = (
    "farm-ppo",
    "farm-quark",
    "farm-dpo",
    "farm-expiter",
    "farm-bon",
    "farm-rloo",
    "farm-grpo",
    "farm-online-dpo",
)


@pytest.fixture(scope="module")
def world(tiny_model_path, tmp_path_factory):
    """(SFT, surrogate reward model paying for blue, gold reward model paying for red)."""
    # the surrogate reward model is a copy: label() writes into its meta.json, and the session's
    # shared keyword model must keep saying nothing of its labels for the other modules' tests
    surrogate = tmp_path_factory.mktemp("surrogate") / "rm"
    shutil.copytree(keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm")), surrogate)
    return (
        tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")),
        surrogate,
        keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("gold"), GOLD_COLOUR),
    )


def label(folder, labels: int) -> None:
    """Say in a reward model's meta.json how many preference records trained it (as farm-rm-train
    does), so the methods' budgets have a number to read."""
    meta = json.loads((folder / "meta.json").read_text())
    meta["preferences"] = {"records": labels, "used": labels}
    (folder / "meta.json").write_text(json.dumps(meta))


def spy_scores(monkeypatch) -> list[dict]:
    """Record every RewardScorer.score call: the scorer's folder, the items, flags and scores."""
    calls: list[dict] = []
    original = RewardScorer.score

    def score(self, items, progress=None, finished=None):
        scores = original(self, items, progress=progress, finished=finished)
        calls.append(
            {"path": self.path, "items": list(items), "finished": finished, "scores": scores}
        )
        return scores

    monkeypatch.setattr(RewardScorer, "score", score)
    return calls


def win_rate(mine: list[float], theirs: list[float]) -> float:
    wins = [1.0 if a > b else 0.5 if a == b else 0.0 for a, b in zip(mine, theirs, strict=True)]
    return 100 * sum(wins) / len(wins)


def answer_length(folder, call: dict) -> float:
    """Mean length in tokens of a gold call's answers, the end token counted where an answer
    finished (as gold_answer_length counts it), from the texts tokenized again."""
    from farmkit.lm.models import load_tokenizer

    tokenizer = load_tokenizer(folder)
    lengths = [
        len(tokenizer(item[2], add_special_tokens=False)["input_ids"]) + bool(done)
        for item, done in zip(call["items"], call["finished"], strict=True)
    ]
    return sum(lengths) / len(lengths)


def metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_policy_tool_has_the_gold_options():
    for tool in POLICY_METHODS:
        command = importlib.import_module(SCRIPTS[tool].split(":")[0]).cli
        flags = {flag for param in command.params for flag in getattr(param, "opts", [])}
        assert {"--gold", "--gold-prompts", "--gold-size"} <= flags, tool
        (option,) = [param for param in command.params if "--gold" in param.opts]
        assert option.metavar == "POOL_OR_RM" and option.default is None, tool


def _bad_gold(tmp_path, bad: str) -> tuple[str, str]:
    """A --gold value naming a pool file that is missing or malformed, and what its error says."""
    if bad == "missing":
        return str(tmp_path / "missing.yaml"), "no such file"
    path = tmp_path / "bad.yaml"
    path.write_text("judges: [\n" if bad == "not YAML" else "name: x\njudges: 3\n")
    return str(path), "not valid YAML" if bad == "not YAML" else "`judges` must be a non-empty list"


@pytest.mark.parametrize("bad", ["missing", "not YAML", "not a pool"])
def test_a_gold_pool_file_missing_or_malformed_is_a_usage_error_before_any_work(tmp_path, bad):
    value, said = _bad_gold(tmp_path, bad)
    pairs = write_jsonl(
        tmp_path / "pairs.jsonl",
        [{"instruction": "x", "output_1": "a", "output_2": "b", "preference": 1}],
    )
    command = importlib.import_module(SCRIPTS["farm-dpo"].split(":")[0]).cli
    args = ["embedded", str(pairs), "-o", str(tmp_path / "out"), "--max-steps", "1"]
    result = CliRunner().invoke(command, [*args, "--gold", value])
    assert result.exit_code == 2, result.output
    message = result.stderr
    assert f"Invalid value for '--gold': {value}" in message and said in message, message
    assert "expected a reward model folder" in message and "Traceback" not in message, message
    assert not (tmp_path / "out").exists()  # before any work


@pytest.mark.parametrize("tool", POLICY_METHODS)
def test_every_policy_tool_refuses_a_missing_gold_pool_file_alike(tmp_path, tool):
    value, said = _bad_gold(tmp_path, "missing")
    command = importlib.import_module(SCRIPTS[tool].split(":")[0]).cli
    result = CliRunner().invoke(command, ["--gold", value])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--gold': {value}: {said}" in result.stderr, result.stderr


def test_gold_prompts_are_a_fixed_slice_or_a_file(tmp_path):
    training = [{"instruction": q, "input": ""} for q in ["a", "b", "a", "c", "d"]]
    chosen, source = gold_module.choose_prompts(training, None, 3)
    assert [r["instruction"] for r in chosen] == ["a", "b", "c"]  # distinct, in order
    assert source == "the first 3 distinct prompts of the training input"
    path = write_jsonl(tmp_path / "held.jsonl", [{"instruction": f"h{i}"} for i in range(5)])
    chosen, source = gold_module.choose_prompts(training, str(path), 2)
    assert [r["instruction"] for r in chosen] == ["h0", "h1"] and "held.jsonl" in source


def test_a_gold_judge_that_is_neither_a_pool_nor_a_reward_model_is_refused(tmp_path, world):
    from farmkit.annotate.run import gold_pool

    sft, _, _ = world
    prompts = [{"instruction": "x"}]
    with pytest.raises(FarmError, match="neither a reward model folder nor an annotator pool"):
        gold_module.GoldEvaluator("no_such_pool", prompts, "test", str(sft), pools=gold_pool)
    with pytest.raises(FarmError, match="not a reward model"):
        gold_module.judge_kind(str(sft))  # a policy folder
    assert gold_module.judge_kind("gold") == "pool"
    # a pool name without a loader of pools (this layer cannot look one up itself)
    with pytest.raises(FarmError, match="--gold gold: not a reward model folder, and no annotator"):
        gold_module.GoldEvaluator("gold", prompts, "test", str(sft))


class RecordingPool:
    """A PoolJudge that prefers the longer output and records what it was asked."""

    def __init__(self, spec, *, seed, cache, device):
        self.spec, self.settings, self.asked = spec, (seed, cache, device), []

    def preferences(self, pairs):
        self.asked.append(pairs)
        cost = {"pairs": len(pairs), "requests": 3, "cache_hits": 1, "price": 0.5}
        return [2 if len(p["output_2"]) > len(p["output_1"]) else 1 for p in pairs], cost


def test_the_gold_pool_is_the_one_the_caller_passes_in(world):
    """train/ sits below the annotate pillar: the gold evaluation asks the pool judge its caller
    built (farmkit.annotate.run.gold_pool in the tools) and imports nothing from farmkit.annotate."""
    import ast

    sft, _, _ = world
    source = (ROOT / "farmkit" / "train" / "gold.py").read_text()
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [name for name in imported if name.startswith("farmkit.annotate")]
    made: list[RecordingPool] = []

    def pools(spec, **settings):
        made.append(RecordingPool(spec, **settings))
        return made[-1]

    request = gold_module.GoldRequest(
        "my_pool", size=3, max_new_tokens=3, seed=5, cache=None, tool="farm-x", pools=pools
    )
    judge = gold_module.make_gold(request, prompt_records(4), str(sft), device="cpu")
    assert [pool.spec for pool in made] == ["my_pool"]
    assert made[0].settings == (5, None, "cpu")
    reference, _ = judge.reference()
    answers = ["a much longer answer than any reference", "", "z"]
    figures = judge.judge(answers, [True] * 3, "step-2")
    (pairs,) = made[0].asked
    assert [(p["output_1"], p["output_2"]) for p in pairs] == list(
        zip(reference, answers, strict=True)
    )
    assert {(p["generator_1"], p["generator_2"]) for p in pairs} == {
        ("gold-reference", "farm-x-step-2")
    }
    expected = [
        100.0 * (len(mine) > len(theirs)) for mine, theirs in zip(answers, reference, strict=True)
    ]
    # the win rate's standard error is farm-winrate's: the sample deviation over the square root of n
    assert figures == {
        "gold_win_rate": pytest.approx(sum(expected) / 3),
        "gold_win_rate_se": pytest.approx(statistics.stdev(expected) / math.sqrt(3)),
    }
    assert judge.block()["annotation"] == {
        "pairs": 3,
        "requests": 3,
        "cache_hits": 1,
        "price": 0.5,
    }


def test_rloo_checkpoints_are_scored_by_the_gold_reward_model(world, tmp_path, monkeypatch):
    from farmkit.methods.group import RLOOConfig, train_group

    sft, rm, gold = world
    label(rm, 40)
    calls = spy_scores(monkeypatch)
    config = RLOOConfig(
        steps=4,
        checkpoint_every=2,
        rollout_batch_size=32,
        samples_per_prompt=4,
        minibatch_size=16,
        micro_batch_size=16,
        learning_rate=2e-3,
        max_new_tokens=4,
        gold=str(gold),
        gold_size=16,
    )
    output = tmp_path / "rloo"
    train_group(str(sft), str(rm), prompt_records(16), str(output), config, seed=0)
    rows = metrics(output / "metrics.jsonl")
    judged = [row for row in rows if "gold_win_rate" in row]
    assert [row["step"] for row in judged] == [2, 4]  # each checkpoint, the last step included
    gold_calls = [call for call in calls if call["path"] == str(gold)]
    # once for the SFT model's reference answers, once per checkpoint; the surrogate never
    # scores the gold answers, nor the gold model the rollouts
    assert len(gold_calls) == 3
    reference, *checkpoints = gold_calls
    assert all(len(call["items"]) == 16 for call in gold_calls)
    assert not any(
        call["items"] == c["items"]
        for call in calls
        if call["path"] == str(rm)
        for c in checkpoints
    )
    surrogate = RewardScorer(rm, device="cpu")
    for row, call in zip(judged, checkpoints, strict=True):
        assert row["gold_reward"] == pytest.approx(sum(call["scores"]) / 16)
        assert row["gold_win_rate"] == pytest.approx(win_rate(call["scores"], reference["scores"]))
        # the gold model pays for red: its score is the share of answers that end in "red"
        texts = [item[2] for item in call["items"]]
        assert row["gold_reward"] == pytest.approx(
            sum(text.split()[-1:] == [GOLD_COLOUR] for text in texts) / 16, abs=1.5 / 16
        )
        blue = sum(surrogate.score(call["items"], finished=call["finished"])) / 16
        assert abs(blue - row["gold_reward"]) > 0.1, (blue, row["gold_reward"])
        assert row["gold_answer_length"] == pytest.approx(answer_length(sft, call), abs=0.2)
    # RLOO taught "blue": the surrogate reward rose, the gold (red) one did not follow it
    assert rows[-1]["reward"] > rows[0]["reward"] + 0.1
    assert judged[-1]["gold_reward"] < rows[-1]["reward"]
    assert judged[-1]["gold_kl"] > 0.01  # the policy moved away from SFT
    budget = check_budget(output, "rloo", 40)
    assert budget["tokens_sampled"] == sum(row["response_length"] * 32 for row in rows)
    meta = json.loads((output / "meta.json").read_text())
    assert meta["gold"]["kind"] == "reward_model" and meta["gold"]["evaluations"] == 2
    assert meta["gold"]["prompts"] == 16 and meta["gold"]["tokens_sampled"] > 0
    # the gold judge only watches: the same run without it trains the same policy
    from safetensors.torch import load_file

    plain = tmp_path / "plain"
    config.gold = None
    train_group(str(sft), str(rm), prompt_records(16), str(plain), config, seed=0)
    unjudged = metrics(plain / "metrics.jsonl")
    assert [(r["reward"], r["kl"]) for r in unjudged] == [(r["reward"], r["kl"]) for r in rows]
    watched, alone = load_file(output / "model.safetensors"), load_file(plain / "model.safetensors")
    assert all(torch.equal(watched[key], alone[key]) for key in watched)


def test_dpo_end_is_scored_by_the_gold_reward_model(world, tmp_path, monkeypatch):
    from farmkit.methods.dpo import DPOConfig, dpo_pairs, train_dpo

    sft, rm, gold = world
    others = [colour for colour in COLOURS if colour != KEYWORD]
    records = [
        {
            "instruction": question,
            "input": "",
            "output_1": KEYWORD,
            "output_2": others[i % 3],
            "preference": 1,
        }
        for i, question in enumerate(QUESTIONS)
    ] + [{"instruction": QUESTIONS[0], "output_1": "a", "output_2": "b", "preference": 1.5}]
    pairs, counts = dpo_pairs(records, "prefs")
    calls = spy_scores(monkeypatch)
    config = DPOConfig(
        learning_rate=2e-3,
        batch_size=8,
        max_steps=4,
        beta=0.1,
        max_new_tokens=4,
        gold=str(gold),
        gold_size=16,
    )
    output = tmp_path / "dpo"
    result = train_dpo(str(sft), pairs, str(output), config, counts=dict(counts))
    rows = metrics(output / "metrics.jsonl")
    assert [("gold_win_rate" in row) for row in rows] == [False] * (len(rows) - 1) + [True]
    gold_calls = [call for call in calls if call["path"] == str(gold)]
    assert len(gold_calls) == 2  # the reference answers, the trained policy's
    reference, end = gold_calls
    assert rows[-1]["gold_reward"] == pytest.approx(sum(end["scores"]) / 16)
    assert rows[-1]["gold_win_rate"] == pytest.approx(win_rate(end["scores"], reference["scores"]))
    assert result["gold_win_rate"] == rows[-1]["gold_win_rate"]
    # DPO learned the labels' "blue"; the red judge's score is not what those labels reward
    blue = sum(RewardScorer(rm, device="cpu").score(end["items"], finished=end["finished"])) / 16
    print("DPO: blue (the labels' colour)", blue, "red (gold)", rows[-1]["gold_reward"])
    assert blue > rows[-1]["gold_reward"] + 0.2, (blue, rows[-1]["gold_reward"])
    assert rows[-1]["gold_win_rate"] < 50  # red lost ground to the labels' colour
    budget = check_budget(output, "dpo", len(records), samples=False)
    assert budget["pairs_trained"] == 16


def test_best_of_n_is_judged_by_the_gold_pool_for_every_n(world, tmp_path, monkeypatch):
    """The gold judge as an annotator pool: an oracle judge whose reward is the red model, asked
    through farm-annotate's engine; its win rate is recomputed from the red model's scores."""
    from farmkit.tools.farm_bon import cli

    from farmkit.annotate.oracle import OracleBackend

    sft, rm, gold = world
    label(rm, 40)
    pool = tmp_path / "gold_pool.yaml"
    pool.write_text(
        "name: red_gold\nflip_rate: 0.0\n"
        f"judges:\n  - {{name: red, backend: oracle, reward: {gold}, temperature: 0.0}}\n"
    )
    judged: list[int] = []
    original = OracleBackend.judge

    async def judge(self, judge_spec, pairs, draws, seed):
        judged.append(len(pairs))
        return await original(self, judge_spec, pairs, draws, seed)

    monkeypatch.setattr(OracleBackend, "judge", judge)
    calls = spy_scores(monkeypatch)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(16))
    args = [str(sft), str(rm), str(prompts), "-n", "1,4", "--max-new-tokens", "4"]
    args += ["--gold", str(pool), "--gold-size", "16", "--metrics", str(tmp_path / "m.jsonl")]
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "best.jsonl")])
    assert result.exit_code == 0, result.output
    rows = metrics(tmp_path / "m.jsonl")
    assert [row["step"] for row in rows] == [1, 4] and [row["n"] for row in rows] == [1, 4]
    # the oracle asked the red model (RewardScorer, spied) once per n, for the reference answers
    # and that n's answers, texts as they are; its win rate follows from those scores alone
    gold_calls = [call for call in calls if call["path"] == str(gold)]
    assert len(gold_calls) == 2
    best = [json.loads(line) for line in (tmp_path / "best.jsonl").read_text().splitlines()]
    # the reference: SFT's own answers to the gold prompts, sampled once (seed `gold reference`)
    judge = gold_module.GoldEvaluator(
        str(gold), prompt_records(16), "test", str(sft), max_new_tokens=4, device="cpu"
    )
    reference, _ = judge.reference()
    # one verdict per gold prompt and n, nothing else asked; an answer identical to the reference
    # is a tie recorded without asking (farm-annotate's rule)
    identical = sum(
        r["output"] == reference[QUESTIONS.index(r["instruction"])]
        for r in best
        if r["best_of"] in (1, 4)
    )
    assert sum(judged) == 2 * 16 - identical
    for row, call in zip(rows, gold_calls, strict=True):
        red = dict(zip(call["items"], call["scores"], strict=True))
        chosen = [r for r in best if r["best_of"] == row["n"]]
        mine, theirs = [], []
        for r, text in zip(chosen, reference, strict=True):
            assert r["instruction"] == QUESTIONS[len(mine)]
            if r["output"] == text:  # a tie the judge was never asked about
                mine.append(0.0)
                theirs.append(0.0)
            else:
                mine.append(red[(r["instruction"], "", r["output"])])
                theirs.append(red[(r["instruction"], "", text)])
        assert row["gold_win_rate"] == pytest.approx(win_rate(mine, theirs))
        assert row["gold_kl"] == pytest.approx(math.log(row["n"]) - (row["n"] - 1) / row["n"])
        print("best of", row["n"], "reward", row["reward"], "gold win rate", row["gold_win_rate"])
    # best-of-4 by the blue model raises the surrogate reward; whether the red judge's verdict falls
    # on 16 prompts of 4 tokens is a coin toss (an expected drop of about 7 points, a standard error of about 11),
    # so the test holds the judge to its exact recomputation above instead
    assert rows[1]["reward"] > rows[0]["reward"] + 0.2
    assert [row["labels_used"] for row in rows] == [40, 40]
    assert rows[1]["tokens_sampled"] > rows[0]["tokens_sampled"] > 0
    assert all(row["training_tokens"] == 0 for row in rows)
    assert "budget: 40 labels used" in result.output


def _gold_rows(path) -> list[dict]:
    return [row for row in metrics(path) if "gold_win_rate" in row]


# the other methods' gold paths, each judged by the red model
@pytest.mark.parametrize("method", ["ppo", "grpo", "quark", "expiter"])
def test_every_method_judges_its_checkpoints(world, tmp_path, monkeypatch, method):
    sft, rm, gold = world
    label(rm, 40)
    calls = spy_scores(monkeypatch)
    output = tmp_path / method
    common = dict(max_new_tokens=4, gold=str(gold), gold_size=8)
    records = prompt_records(16)
    if method in ("ppo", "grpo"):
        from farmkit.methods.group import GRPOConfig, train_group
        from farmkit.methods.ppo import PPOConfig, train_ppo

        sizes = dict(rollout_batch_size=16, minibatch_size=16, micro_batch_size=16, **common)
        if method == "ppo":
            train_ppo(str(sft), str(rm), records, str(output), PPOConfig(steps=2, **sizes))
        else:
            config = GRPOConfig(steps=2, samples_per_prompt=4, **sizes)
            train_group(str(sft), str(rm), records, str(output), config)
        expected, rows_path = [2], output / "metrics.jsonl"  # checkpoint-every 20: the last step
    elif method == "quark":
        from farmkit.methods.quark import QuarkConfig, train_quark

        config = QuarkConfig(
            rounds=2, prompts_per_round=8, samples_per_prompt=2, num_quantiles=2, **common
        )
        train_quark(str(sft), str(rm), records, str(output), config)
        expected, rows_path = [1, 2], output / "metrics.jsonl"  # rounds
    else:
        from farmkit.methods.bon import BestOfNConfig
        from farmkit.methods.expiter import expert_iteration
        from farmkit.methods.sft import SFTConfig

        request = gold_module.GoldRequest(str(gold), size=8, max_new_tokens=4)
        judge = gold_module.make_gold(request, records, str(sft), device="cpu")
        expert_iteration(
            str(sft),
            str(rm),
            records,
            output,
            BestOfNConfig(ns=(2,), max_new_tokens=4),
            SFTConfig(max_steps=1, batch_size=8, max_length=64),
            rounds=2,
            gold=judge,
        )
        expected, rows_path = [1, 2], output / "metrics.jsonl"  # each round's last row
    judged = _gold_rows(rows_path)
    key = "step" if method in ("ppo", "grpo") else "round"
    assert [row[key] for row in judged] == expected
    gold_calls = [call for call in calls if call["path"] == str(gold)]
    assert len(gold_calls) == 1 + len(expected)  # the reference, then each checkpoint
    for row, call in zip(judged, gold_calls[1:], strict=True):
        assert row["gold_reward"] == pytest.approx(sum(call["scores"]) / 8)
        assert row["gold_win_rate"] == pytest.approx(
            win_rate(call["scores"], gold_calls[0]["scores"])
        )
        assert row["gold_answer_length"] == pytest.approx(answer_length(sft, call), abs=0.2)
        if method == "quark":  # sampled behind the control token; none in the answers
            assert not any("reward_quantile" in item[2] for item in call["items"])
    meta = json.loads((output / "meta.json").read_text())
    assert meta["gold"]["evaluations"] == len(expected)
    check_budget(output, method, 40)


def test_gold_is_refused_under_several_processes(monkeypatch):
    from farmkit.core import distributed

    gold_module.check_processes()  # one process: fine
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    with pytest.raises(FarmError, match="--gold runs in one process"):
        gold_module.check_processes()
    with pytest.raises(FarmError, match="--gold runs in one process"):
        gold_module.GoldEvaluator("gold", [{"instruction": "x"}], "test", "embedded")
