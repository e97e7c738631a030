"""farm-online-dpo as the paper runs it: one optimizer and one learning-rate schedule over all the
rounds (--fresh-optimizer-each-round: a new one every round, the old behaviour); an answer cut at
--max-new-tokens is trained without the end token it never produced; the pairs are sampled from
exactly the tempered policy in fp32, the model's generation_config (repetition_penalty, top_k...)
set aside, as the RL rollouts sample. On the tiny colour policy, with the offline default pool."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from policy_fixtures import prompt_records, tiny_sft, write_jsonl


@pytest.fixture(scope="module")
def sft(tiny_model_path, tmp_path_factory):
    return tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", prompt_records(16))


def run(sft: Path, prompts: Path, output: Path, *extra: str):
    from farmkit.tools.farm_online_dpo import cli

    args = [
        str(sft),
        str(prompts),
        "-o",
        str(output),
        "--prompts-per-round",
        "8",
        "--rounds",
        "2",
        "--max-new-tokens",
        "4",
        "--learning-rate",
        "1e-3",
        "--batch-size",
        "4",
        "--max-steps",
        "3",
        "--no-cache",
        "-q",
        *extra,
    ]
    return CliRunner().invoke(cli, args, env={"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None})


def round_rates(output: Path, number: int) -> list[float]:
    path = output.parent / f"{output.name}-checkpoints" / f"round_{number}" / "policy"
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [row["learning_rate"] for row in rows if "learning_rate" in row]


def test_the_optimizer_and_the_schedule_continue_across_rounds(sft, prompts, tmp_path):
    output = tmp_path / "continued"
    result = run(sft, prompts, output)
    assert result.exit_code == 0, result.output
    first, second = round_rates(output, 1), round_rates(output, 2)
    assert len(first) == len(second) == 3
    # one linear decay over the run's 6 steps: round 2 carries on below where round 1 ended
    assert first == sorted(first, reverse=True) and second == sorted(second, reverse=True)
    assert max(second) < min(first)
    assert first[0] == pytest.approx(1e-3)
    assert second[0] == pytest.approx(1e-3 * 3 / 6)
    # the Adam moments went on: round 2's optimizer state counts all 6 steps
    state = torch.load(
        output.parent / f"{output.name}-checkpoints" / "round_2" / "optimizer.pt",
        weights_only=True,
    )
    assert {int(param["step"]) for param in state["state"].values()} == {6}
    # a rerun of the last round (as if stopped while training it) continues round 1's state
    checkpoints = output.parent / f"{output.name}-checkpoints"
    weights = (checkpoints / "round_2" / "policy" / "model.safetensors").read_bytes()
    (checkpoints / "round_2" / "round.json").unlink()
    shutil.rmtree(checkpoints / "round_2" / "policy")
    (checkpoints / "round_2" / "optimizer.pt").unlink()
    result = run(sft, prompts, output)
    assert result.exit_code == 0, result.output
    assert round_rates(output, 2) == pytest.approx(second)
    assert (checkpoints / "round_2" / "policy" / "model.safetensors").read_bytes() == weights

    fresh = tmp_path / "fresh"
    result = run(sft, prompts, fresh, "--fresh-optimizer-each-round")
    assert result.exit_code == 0, result.output
    first, second = round_rates(fresh, 1), round_rates(fresh, 2)
    assert second == pytest.approx(first) and first[0] == pytest.approx(1e-3)
    assert not list((fresh.parent / f"{fresh.name}-checkpoints").rglob("optimizer.pt"))
    meta = json.loads((fresh / "meta.json").read_text())
    assert meta["config"]["fresh_optimizer_each_round"] is True


def test_a_cut_answer_is_trained_without_an_end_token(tiny_model_path):
    from farmkit.lm.models import PromptFormat, load_tokenizer
    from farmkit.methods.dpo import pair_rows

    tokenizer = load_tokenizer(tiny_model_path)
    fmt = PromptFormat("chat")
    pair = {"instruction": "Name a colour.", "input": "", "chosen": "blue", "rejected": "red red"}
    (whole,) = pair_rows(tokenizer, fmt, [pair], max_length=64)
    (cut,) = pair_rows(
        tokenizer, fmt, [{**pair, "chosen_finished": False}], max_length=64
    )  # the chosen answer hit --max-new-tokens
    assert whole["chosen_ids"][-1] == tokenizer.eos_token_id
    assert tokenizer.eos_token_id not in cut["chosen_ids"]
    assert cut["chosen_ids"] == tokenizer("blue", add_special_tokens=False)["input_ids"]
    assert cut["rejected_ids"] == whole["rejected_ids"]  # finished: keeps its end token
    assert whole["prompt_ids"] == cut["prompt_ids"]


def test_preference_records_carry_which_answer_was_cut():
    from farmkit.methods.dpo import dpo_pairs

    record = {
        "instruction": "q",
        "output_1": "a cut ans",
        "output_2": "whole",
        "preference": 1,
        "finished_1": False,
        "finished_2": True,
    }
    (pair,), _ = dpo_pairs([record], "prefs.jsonl")
    assert (pair["chosen"], pair["chosen_finished"]) == ("a cut ans", False)
    assert "rejected_finished" not in pair  # finished answers: the pair as before
    (pair,), _ = dpo_pairs([{**record, "preference": 2}], "prefs.jsonl")
    assert (pair["rejected"], pair["rejected_finished"]) == ("a cut ans", False)
    (pair,), _ = dpo_pairs([{k: v for k, v in record.items() if "finished" not in k}], "p")
    assert set(pair) == {"instruction", "input", "chosen", "rejected"}


def test_pairs_are_sampled_without_the_models_generation_config(sft, tmp_path, monkeypatch):
    from farmkit.methods.online_dpo import OnlineDPOConfig, _sample_pairs

    shaped = tmp_path / "shaped"
    shutil.copytree(sft, shaped)
    (shaped / "generation_config.json").write_text(
        json.dumps({"repetition_penalty": 50.0, "top_k": 1, "no_repeat_ngram_size": 1})
    )
    records = prompt_records(8)
    config = OnlineDPOConfig(max_new_tokens=6, generation_batch_size=16, rollout_backend="hf")
    from farmkit.lm import models

    dtypes = []
    real_load = models.load_causal_lm

    def spy(path, device="auto", dtype="auto"):
        dtypes.append(dtype)  # on a GPU "auto" is bf16; the trainers sample and train in fp32
        return real_load(path, device=device, dtype=dtype)

    monkeypatch.setattr(models, "load_causal_lm", spy)
    plain, _ = _sample_pairs(str(sft), str(sft), records, config, 3, "g")
    extras, _ = _sample_pairs(str(shaped), str(sft), records, config, 3, "g")
    texts = [(pair["output_1"], pair["output_2"]) for pair in plain]
    assert texts == [(pair["output_1"], pair["output_2"]) for pair in extras]
    assert len(set(texts)) > 1  # sampled, not one fixed answer
    assert dtypes == ["float32", "float32"]
    assert all(
        isinstance(pair["finished_1"], bool) and isinstance(pair["finished_2"], bool)
        for pair in plain
    )


def test_a_vllm_round_samples_in_fp32_too(sft, monkeypatch):
    """The vLLM path builds its engine in fp32, as the RL rollouts' engine (no vLLM needed here:
    the engine and its sampling are stood in for)."""
    from farmkit.lm import sampling
    from farmkit.lm.generation import Sample
    from farmkit.methods.online_dpo import OnlineDPOConfig, _sample_pairs
    from farmkit.train import rollout_backends

    engines = []
    monkeypatch.setattr(rollout_backends, "resolve_backend", lambda name: "vllm")
    monkeypatch.setattr(
        sampling, "vllm_engine", lambda path, dtype="auto", seed=0: engines.append(dtype)
    )
    monkeypatch.setattr(
        sampling,
        "vllm_generate",
        lambda engine, tokenizer, texts, decoding, seed: [
            [Sample("a", 1, 1, True), Sample("b", 1, 4, False)] for _ in texts
        ],
    )
    config = OnlineDPOConfig(max_new_tokens=4, rollout_backend="vllm")
    pairs, tokens = _sample_pairs(str(sft), str(sft), prompt_records(2), config, 0, "g")
    assert engines == ["float32"]
    assert [(pair["finished_1"], pair["finished_2"]) for pair in pairs] == [
        (True, False),
        (True, False),
    ]
