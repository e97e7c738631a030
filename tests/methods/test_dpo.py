"""farm-dpo on the tiny model: preference records for "blue" over other colours; DPO raises the
chosen-over-rejected log-probability margin on its training pairs, ties and nulls are left out and
counted, and the saved folder loads and samples."""

from __future__ import annotations

import json
import time

import pytest
import torch
from click.testing import CliRunner
from policy_fixtures import (
    COLOURS,
    KEYWORD,
    QUESTIONS,
    check_budget,
    keyword_probability,
    keyword_reward_model,
    sampled_rewards,
    spy_adamw,
    tiny_sft,
    write_jsonl,
)

from farmkit.lm.modelio import META_KEYS
from farmkit.methods.dpo import DPOConfig


def preference_records() -> list[dict]:
    records = []
    others = [colour for colour in COLOURS if colour != KEYWORD]
    for i, question in enumerate(QUESTIONS):
        other = others[i % len(others)]
        first, second, verdict = (KEYWORD, other, 1) if i % 2 else (other, KEYWORD, 2)
        records.append(
            {
                "instruction": question,
                "input": "",
                "output_1": first,
                "output_2": second,
                "preference": verdict,
            }
        )
    records.append(
        {"instruction": QUESTIONS[0], "output_1": "red", "output_2": "green", "preference": 1.5}
    )
    records.append(
        {
            "instruction": QUESTIONS[1],
            "output_1": "red",
            "output_2": "green",
            "preference": None,
            "preference_reason": "unparseable",
        }
    )
    return records


def margins(folder, pairs) -> torch.Tensor:
    """log p(chosen) - log p(rejected) (eos included) for each pair, under the model in `folder`."""
    from farmkit.lm.models import PromptFormat, load_causal_lm
    from farmkit.train.policy import response_logits, rollout_from_lists, token_logprobs

    model, tokenizer = load_causal_lm(folder, device="cpu")
    fmt = PromptFormat.for_model(folder)
    prompts = [
        tokenizer(fmt.prompt(tokenizer, pair["instruction"]), add_special_tokens=False)["input_ids"]
        for pair in pairs
    ]

    def logprob(key: str) -> torch.Tensor:
        responses = [
            tokenizer(pair[key], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            for pair in pairs
        ]
        batch = rollout_from_lists(prompts, responses, tokenizer.pad_token_id)
        with torch.no_grad():
            return (
                token_logprobs(response_logits(model, batch, 1.0), batch.response_ids)
                * batch.response_mask
            ).sum(1)

    return logprob("chosen") - logprob("rejected")


@pytest.fixture(scope="module")
def sft(tiny_model_path, tmp_path_factory):
    return tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft"))


def test_dpo_raises_the_chosen_over_rejected_margin(sft, tiny_model_path, tmp_path):
    from farmkit.tools.farm_dpo import cli

    from farmkit.methods.dpo import dpo_pairs

    prefs = write_jsonl(tmp_path / "prefs.jsonl", preference_records())
    output = tmp_path / "dpo"
    args = [
        str(sft),
        str(prefs),
        "-o",
        str(output),
        "--learning-rate",
        "2e-3",
        "--batch-size",
        "8",
        "--max-steps",
        "4",
        "--beta",
        "0.1",
        "-q",
    ]
    began = time.monotonic()
    result = CliRunner().invoke(cli, args)
    took = time.monotonic() - began
    assert result.exit_code == 0, result.output
    meta = json.loads((output / "meta.json").read_text())
    assert meta["kind"] == "policy" and meta["tool"] == "farm-dpo" and meta["config"]["beta"] == 0.1
    assert set(META_KEYS) <= set(meta) and list(meta["inputs"]) == [str(prefs)]
    assert meta["pairs"] == {"used": 16, "tie": 1, "null": 1}
    pairs, _ = dpo_pairs(preference_records(), "prefs")
    before, after = margins(sft, pairs), margins(output, pairs)
    assert (after - before).mean() > 0.5, (before.mean(), after.mean())  # nats
    assert (after > before).all()
    assert keyword_probability(output) > keyword_probability(sft) + 0.05
    history = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert history[-1]["rewards/margins"] > history[0]["rewards/margins"]
    # every preference record read counts (ties and nulls were paid for too); DPO samples nothing
    budget = check_budget(output, "dpo", 18, samples=False, within=took)
    assert budget["pairs_trained"] == 16
    assert [row["training_tokens"] for row in history] == [row["num_tokens"] for row in history]
    rm = keyword_reward_model(tiny_model_path, tmp_path / "rm")
    texts, _ = sampled_rewards(output, rm, n=1)
    assert len(texts) == len(QUESTIONS)


def test_only_ties_and_nulls_is_an_error(tmp_path):
    from farmkit.tools.farm_dpo import cli

    prefs = write_jsonl(tmp_path / "prefs.jsonl", preference_records()[-2:])
    result = CliRunner().invoke(cli, ["no-such-model/", str(prefs), "-o", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert "every verdict is a tie or null" in str(
        result.exception
    )  # entry_point prints it as one line
    assert str(prefs) in str(result.exception)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_type": "sigmoid,nope"}, "unknown loss type nope"),
        ({"loss_type": "sigmoid,ipo", "loss_weights": "1"}, "one weight per loss"),
        ({"label_smoothing": 0.1}, "robust"),
    ],
)
def test_config_rejects_bad_combinations(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DPOConfig(**kwargs)


@pytest.mark.parametrize(
    ("loss_type", "weights", "expected"),
    [
        ("hinge", None, 1.0),  # relu(1 - beta * 0)
        ("ipo", None, 25.0),  # (0 - 1 / (2 beta))^2
        ("hinge,ipo", "1,0.5", 1.0 + 0.5 * 25.0),
    ],
)
def test_loss_variants_reach_trl(sft, tmp_path, loss_type, weights, expected, monkeypatch):
    """The loss TRL computes is the one asked for, with its weights: at the first step the policy
    is the reference, every log-ratio margin is 0, and each loss type has a known value there (TRL's
    default, sigmoid, would give log 2 = 0.693)."""
    from farmkit.methods.dpo import train_dpo

    pairs = [
        {"instruction": q, "input": "", "chosen": KEYWORD, "rejected": "red"} for q in QUESTIONS[:4]
    ]
    options = {"loss_weights": weights} if weights else {}
    config = DPOConfig(
        loss_type=loss_type, beta=0.1, max_steps=1, batch_size=4, learning_rate=1e-4, **options
    )
    optimizers = spy_adamw(monkeypatch)
    last = train_dpo(str(sft), pairs, str(tmp_path / "out"), config)
    assert [o.defaults["fused"] for o in optimizers] == [True]  # torch's fused AdamW, the default
    assert last["loss"] == pytest.approx(expected, rel=1e-4)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["config"]["loss_type"] == loss_type


def test_fused_adamw_switched_off_gives_the_trainer_the_per_tensor_loop(sft, tmp_path, monkeypatch):
    """farm-dpo's Trainer steps torch's fused AdamW by default (checked in
    test_loss_variants_reach_trl, which trains anyway); FARMKIT_FUSED_ADAMW=0 reaches it too
    (tests/train/test_policy.py: the same update)."""
    from farmkit.methods.dpo import train_dpo

    created = spy_adamw(monkeypatch)
    monkeypatch.setenv("FARMKIT_FUSED_ADAMW", "0")
    pairs = [
        {"instruction": q, "input": "", "chosen": KEYWORD, "rejected": "red"} for q in QUESTIONS[:4]
    ]
    config = DPOConfig(max_steps=1, batch_size=4, learning_rate=1e-4)
    train_dpo(str(sft), pairs, str(tmp_path / "out"), config)
    assert [bool(o.defaults["fused"]) for o in created] == [False]
