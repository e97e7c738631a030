"""farm-online-dpo on the tiny colour policy, labelled by a judge behind a real local OpenAI-compatible
server (tests/openai_server.py) that prefers the answer "blue": every label comes from that judge
(counted per request), a rerun with the cache asks nothing, an interrupted run resumes from its saved
labels, --max-cost stops the run cleanly, DPO moves the policy towards what the judge prefers, and
the folder loads in farm-sample. One test runs the default offline pool, with no endpoint at all."""

from __future__ import annotations

import importlib.resources
import json
import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from openai_server import OpenAIServer, shown_pairs, verdict_text
from policy_fixtures import (
    KEYWORD,
    check_budget,
    keyword_probability,
    prompt_records,
    tiny_sft,
    write_jsonl,
)

from farmkit.core.validate import problems

FAST = "settings: {timeout: 5.0, backoff: 0.02, max_retries: 4, concurrency: 4}\n"
ENV = {"OPENAI_API_KEY": "sk-test-online-dpo"}


def winner(a: str, b: str) -> str:
    """The scripted judge, shown A then B: an answer that starts with the keyword beats one that does
    not; otherwise a tie. Ties are left out of DPO, so every pair it trains on points one way (a
    judge that broke ties by position gave DPO a majority of pairs with no direction, which moved the
    tiny policy anywhere, the keyword's probability included)."""
    a_blue, b_blue = a.strip().startswith(KEYWORD), b.strip().startswith(KEYWORD)
    if a_blue == b_blue:
        return "tie"
    return "A" if a_blue else "B"


def judged(record: dict) -> float:
    """The preference the scripted judge gives a record, the order it was shown in undone."""
    first, second = record["output_1"], record["output_2"]
    swapped = record["provenance"]["farm-annotate"]["order_shown"] == "2,1"
    verdict = winner(second, first) if swapped else winner(first, second)
    if verdict == "tie":
        return 1.5
    return 1 if (verdict == "A") != swapped else 2


def judge_blue(body: dict) -> str:
    format, pairs = shown_pairs(body)
    return verdict_text(format, [winner(a, b) for a, b in pairs])


def _pool(tmp_path: Path) -> str:
    """The shipped one-judge pool (an openai judge: cached, priced), with short timeouts."""
    text = (
        importlib.resources.files("farmkit.annotate").joinpath("pools", "single.yaml").read_text()
    )
    path = tmp_path / "judge.yaml"
    path.write_text(text.replace("judges:", FAST + "judges:", 1))
    return str(path)


@pytest.fixture(scope="module")
def sft(tiny_model_path, tmp_path_factory):
    return tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", prompt_records(16))


def run(sft: Path, prompts: Path, output: Path, *extra: str, env: dict | None = None):
    from farmkit.tools.farm_online_dpo import cli

    args = [
        str(sft),
        str(prompts),
        "-o",
        str(output),
        "--prompts-per-round",
        "16",
        "--max-new-tokens",
        "4",
        "--learning-rate",
        "2e-3",
        "--batch-size",
        "8",
        "--max-steps",
        "4",
        "--beta",
        "0.1",
        "-q",
        *extra,
    ]
    return CliRunner().invoke(cli, args, env=env or {})


def metrics(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]


def rounds(output: Path) -> Path:
    """Where a run's rounds live: OUTPUT-checkpoints beside the policy folder OUTPUT."""
    return output.parent / f"{output.name}-checkpoints"


def preferences(output: Path, number: int) -> list[dict]:
    path = rounds(output) / f"round_{number}" / "preferences.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_labels_come_from_the_pool_cache_and_resume_pay_nothing_twice(sft, prompts, tmp_path):
    pool, cache = _pool(tmp_path), str(tmp_path / "verdicts.sqlite")
    first, second = tmp_path / "first", tmp_path / "second"
    with OpenAIServer(respond=judge_blue) as server:
        env = {**ENV, "OPENAI_BASE_URL": server.url}
        common = ("--pool", pool, "--rounds", "2")
        result = run(sft, prompts, first, *common, "--cache", cache, env=env)
        assert result.exit_code == 0, result.output
        asked = server.outcomes["ok"]
        lines = metrics(first)
        assert [line["round"] for line in lines] == [1, 2]
        # the one metrics schema of every trainer: a step is a round
        assert [line["step"] for line in lines] == [1, 2]
        assert all(
            line["method"] == "online-dpo" and problems(line, "metrics") is None for line in lines
        )
        # every label that was not a tie of identical answers cost one request to the judge
        assert asked == sum(line["annotator_requests"] for line in lines) > 0
        for number, line in enumerate(lines, start=1):
            records = preferences(first, number)
            assert len(records) == 16
            asked_here = [r for r in records if r["output_1"] != r["output_2"]]
            # asked once each: a pair that a round before already asked (same prompt, same answers) is
            # served by the cache
            assert line["annotator_requests"] + line["cache_hits"] == len(asked_here)
            # DPO uses the pairs with a winner; the judge's ties and identical answers are left out
            assert line["pairs_trained"] == sum(r["preference"] != 1.5 for r in records) > 0
            # every label paid for counts in the budget (a running total over the rounds)
            assert line["labels_used"] == 16 * number
            for record in records:
                assert problems(record, "preference") is None
                assert record["annotator"] == "single"
            for record in asked_here:  # the judge's verdict, its order shown undone
                assert record["preference"] == judged(record)
                assert record["provenance"]["farm-annotate"]["judge"] == "plain-large-t0"
        assert lines[0]["dpo_loss"] < lines[0]["dpo_loss_first"]
        meta = json.loads((first / "meta.json").read_text())
        assert meta["tool"] == "farm-online-dpo" and meta["kind"] == "policy"
        assert meta["policy_round"] == 2
        # what the run paid: each question once (a record served by the cache repeats the price its
        # verdict cost when it was asked)
        paid = {}
        for r in (r for n in (1, 2) for r in preferences(first, n)):
            stamp = r["provenance"]["farm-annotate"]
            shown = (r["output_1"], r["output_2"])[
                :: -1 if stamp.get("order_shown") == "2,1" else 1
            ]
            paid[(r["instruction"], *shown)] = stamp.get("price", 0)
        spent = sum(paid.values())
        assert meta["budget"]["spent"] == pytest.approx(spent, rel=1e-6, abs=1e-9) and spent > 0
        assert meta["budget"]["annotator_requests"] == asked
        assert meta["budget"]["labels_used"] == lines[-1]["labels_used"] == 32
        assert meta["budget"]["pairs_trained"] == sum(line["pairs_trained"] for line in lines)
        check_budget(first, "online-dpo", 32)

        # the same run elsewhere, with the same cache: the same labels, and not one request
        result = run(sft, prompts, second, *common, "--cache", cache, env=env)
        assert result.exit_code == 0, result.output
        assert server.outcomes["ok"] == asked
        again = metrics(second)
        assert [line["annotator_requests"] for line in again] == [0, 0]
        assert sum(line["cache_hits"] for line in again) == sum(
            line["annotator_requests"] + line["cache_hits"] for line in lines
        )
        for number in (1, 2):
            assert [
                (r["output_1"], r["output_2"], r["preference"]) for r in preferences(second, number)
            ] == [
                (r["output_1"], r["output_2"], r["preference"]) for r in preferences(first, number)
            ]

        # interrupted after round 2's labels were saved: the rerun trains on them, without the cache
        shutil.rmtree(rounds(first) / "round_2" / "policy")
        (rounds(first) / "round_2" / "round.json").unlink()
        result = run(sft, prompts, first, *common, "--no-cache", env=env)
        assert result.exit_code == 0, result.output
        assert server.outcomes["ok"] == asked
        assert (rounds(first) / "round_2" / "policy" / "meta.json").is_file()
        assert [line["round"] for line in metrics(first)] == [1, 2]

        # more rounds continue the run: only the new round asks
        result = run(
            sft, prompts, first, "--pool", pool, "--rounds", "3", "--cache", cache, env=env
        )
        assert result.exit_code == 0, result.output
        third = metrics(first)[2]
        assert third["round"] == 3
        assert server.outcomes["ok"] == asked + third["annotator_requests"]

        # other settings cannot reuse those rounds
        result = run(
            sft, prompts, first, *common, "--cache", cache, "--temperature", "0.7", env=env
        )
        assert result.exit_code == 1 and "other settings" in str(result.exception)

    # the judge prefers blue: the policy now says blue more often than the SFT model did
    assert keyword_probability(first) > keyword_probability(sft) + 0.05


def test_max_cost_stops_the_run_cleanly(sft, prompts, tmp_path):
    pool = _pool(tmp_path)
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpt-4.1: {prompt: 1000.0, completion: 1000.0}\n")  # dearer than gold
    with OpenAIServer(respond=judge_blue) as server:
        env = {**ENV, "OPENAI_BASE_URL": server.url}
        common = ("--pool", pool, "--no-cache", "--prices", str(prices), "--rounds", "3")
        # too little for a single pair: nothing is asked, nothing is written as a policy
        poor = tmp_path / "poor"
        result = run(sft, prompts, poor, *common, "--max-cost", "0.001", env=env)
        assert result.exit_code == 1 and "no round was trained" in str(result.exception)
        assert server.outcomes == {} and not (poor / "meta.json").exists()

        # enough for part of the first round: it is labelled as far as the budget goes, trained, and
        # the run ends there with a loadable policy
        output = tmp_path / "budget"
        # one DPO step: what this test checks is the budget, not what the round learned
        result = run(
            sft, prompts, output, *common, "--max-cost", "1.0", "--max-steps", "1", env=env
        )
        assert result.exit_code == 0, result.output
    lines = metrics(output)
    assert [line["round"] for line in lines] == [1]
    meta = json.loads((output / "meta.json").read_text())
    budget = meta["budget"]
    assert 0 < budget["spent"] <= 1.0 and "max-cost" in budget["stopped"]
    assert server.outcomes["ok"] == budget["annotator_requests"] == lines[0]["annotator_requests"]
    labelled = preferences(output, 1)
    assert 0 < len(labelled) < 16
    assert not (rounds(output) / "round_2").exists()


def test_default_pool_is_offline_and_the_folder_samples(sft, prompts, tmp_path, monkeypatch):
    from farmkit.tools.farm_sample import cli as sample

    from farmkit.annotate.run import Run
    from farmkit.methods import dpo

    # what DPO trains on, and every verdict the gold pool gives
    trained, gold_verdicts = [], []
    train_dpo, records_of = dpo.train_dpo, Run.records

    def spy_train(policy, pairs, *args, **kwargs):
        trained.extend(pairs)
        return train_dpo(policy, pairs, *args, **kwargs)

    def spy_records(self, items):
        out = list(records_of(self, items))
        gold_verdicts.extend(
            r["preference"] for r in out if r.get("generator_1") == "gold-reference"
        )
        return iter(out)

    monkeypatch.setattr(dpo, "train_dpo", spy_train)
    monkeypatch.setattr(Run, "records", spy_records)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    output = tmp_path / "offline"
    gold = ("--gold", "gold", "--gold-size", "8")  # the offline gold pool watches the round
    # one DPO step: the test checks what DPO is given and what the gold pool says, not learning
    result = run(sft, prompts, output, "--rounds", "1", "--no-cache", "--max-steps", "1", *gold)
    assert result.exit_code == 0, result.output
    # OUTPUT is the policy folder, written whole; the run's rounds live beside it
    assert not list(output.glob("round_*")) and not (output / "run.json").exists()
    assert (rounds(output) / "round_1" / "policy" / "meta.json").is_file()
    assert (rounds(output) / "metrics.jsonl").read_text() == (output / "metrics.jsonl").read_text()
    line = metrics(output)[0]
    # the gold win rate is the gold pool's verdicts on the 8 gold prompts, as farm-winrate counts them
    decided = [v for v in gold_verdicts if v is not None]
    assert len(gold_verdicts) == 8 and decided
    assert line["gold_win_rate"] == pytest.approx(100 * sum(v - 1 for v in decided) / len(decided))
    assert 1 <= line["gold_answer_length"] <= 4  # --max-new-tokens 4, an end token among them
    meta = json.loads((output / "meta.json").read_text())
    assert meta["gold"]["kind"] == "pool" and meta["gold"]["evaluations"] == 1
    assert meta["gold"]["annotation"]["pairs"] == 8
    check_budget(output, "online-dpo", 16)
    records = preferences(output, 1)
    assert {r["annotator"] for r in records} == {"sim_ann_offline"}
    # DPO trains on each labelled pair with a winner, the preferred output as the chosen one
    expected = [
        (r["output_2"], r["output_1"]) if r["preference"] == 2 else (r["output_1"], r["output_2"])
        for r in records
        if r["preference"] in (1, 2)
    ]
    assert expected and [(p["chosen"], p["rejected"]) for p in trained] == expected
    assert all(problems(r, "preference") is None for r in records)
    assert line["annotator_requests"] == 0 and line["price"] == 0  # in-process judges: free
    assert line["judge_calls"] > 0  # the oracle judges were asked (the noised labels were not)
    sampled = CliRunner().invoke(
        sample, [str(output), str(prompts), "--max-new-tokens", "4", "-q"], catch_exceptions=False
    )
    assert sampled.exit_code == 0
    outputs = [orjson.loads(line) for line in sampled.stdout.splitlines()]
    assert all(problems(record, "output") is None for record in outputs)
    assert {record["instruction"] for record in outputs} == {
        record["instruction"] for record in prompt_records(16)
    }


@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("WORLD_SIZE", "2", "runs as one process"),
        ("ACCELERATE_USE_DEEPSPEED", "true", "does not run under DeepSpeed"),
    ],
)
def test_a_multi_process_or_deepspeed_launch_is_refused_before_any_work(
    tmp_path, monkeypatch, variable, value, message
):
    """farm-online-dpo is not rank-aware (every process would sample, pay the judges for the same
    pairs and write the rounds): a launch with several processes or DeepSpeed ends with a clear error
    before it reads a model or writes a file, not N copies of the run."""
    from farmkit.core.io import FarmError
    from farmkit.methods.online_dpo import Annotation, OnlineDPOConfig, train_online_dpo

    monkeypatch.setenv(variable, value)  # what torchrun / accelerate launch --use_deepspeed set
    output, asked = tmp_path / "online", []
    with pytest.raises(FarmError, match=message):
        train_online_dpo(
            "no-sft", prompt_records(4), str(output), OnlineDPOConfig(), Annotation(), asked.append
        )
    assert not output.exists() and asked == []


def test_the_cli_refuses_a_two_process_launch_with_exit_1(tmp_path):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(4))
    result = run(tmp_path / "no-sft", prompts, tmp_path / "online", env={"WORLD_SIZE": "2"})
    assert result.exit_code == 1, result.output
    assert "runs as one process" in str(result.exception) and "WORLD_SIZE=2" in str(
        result.exception
    )
    assert not (tmp_path / "online").exists()
