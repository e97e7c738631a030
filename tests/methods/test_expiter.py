"""farm-expiter: best-of-n with a reward model, then SFT on the winners, for two rounds. SFT is given
exactly the winners by the reward model's scores (recomputed apart), the folder loads as a policy,
its weights moved, and meta.json records both steps of every round."""

from __future__ import annotations

import json
import time

import pytest
from farmkit.tools.farm_expiter import main as expiter_main
from policy_fixtures import check_budget
from test_reward import run_main, train_keyword_rm, write_jsonl

from farmkit.core.seeds import derive_seed
from farmkit.lm.generation import Sample
from farmkit.methods.bon import ScoredPrompt
from farmkit.methods.expiter import winners
from farmkit.train.scoring import RewardScorer


def test_winners_are_the_best_of_the_first_n():
    prompt = ScoredPrompt(
        {"instruction": "x", "input": None},
        [Sample(t, 1, 1, True) for t in "abcd"],
        [0.1, 0.9, 0.5, 2.0],
    )
    assert winners([prompt], 3) == [{"instruction": "x", "input": "", "output": "b"}]
    assert winners([prompt], 4)[0]["output"] == "d"


def test_two_rounds_write_a_trained_policy_with_both_steps_recorded(
    tiny_model_path, tmp_path, monkeypatch
):
    from safetensors.torch import load_file

    from farmkit.lm.models import load_causal_lm
    from farmkit.methods import expiter, sft

    sampled, taught = [], []  # per round: (policy, scored prompts); the demonstrations SFT received
    sample_and_score, train_sft = expiter.sample_and_score, sft.train_sft

    def spy_sample(policy, scorer, prompts, config, device="auto"):
        scored = sample_and_score(policy, scorer, prompts, config, device=device)
        sampled.append((str(policy), scored))
        return scored

    def spy_train(model, examples, output_dir, config, **options):
        taught.append([dict(example) for example in examples])
        return train_sft(model, examples, output_dir, config, **options)

    monkeypatch.setattr(expiter, "sample_and_score", spy_sample)
    monkeypatch.setattr(sft, "train_sft", spy_train)
    train_keyword_rm(tiny_model_path, tmp_path / "rm", pairs=64, epochs=1)
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"instruction": f"Describe river {i}", "input": ""} for i in range(6)],
    )
    began = time.monotonic()
    code = run_main(
        expiter_main,
        [
            str(tiny_model_path),
            str(tmp_path / "rm"),
            str(prompts),
            "-o",
            str(tmp_path / "policy"),
            "-n",
            "4",
            "--rounds",
            "2",
            "--max-new-tokens",
            "8",
            "--max-steps",
            "2",
            "--learning-rate",
            "1e-3",
            "--batch-size",
            "6",
            "-q",
        ],
    )
    assert code == 0
    network, _ = load_causal_lm(tmp_path / "policy", device="cpu")
    assert network.config.num_hidden_layers == 2
    base = load_file(tiny_model_path / "model.safetensors")
    trained = load_file(tmp_path / "policy" / "model.safetensors")
    assert not (
        trained["model.layers.1.mlp.down_proj.weight"]
        == base["model.layers.1.mlp.down_proj.weight"]
    ).all()

    meta = json.loads((tmp_path / "policy" / "meta.json").read_text())
    assert (
        meta["tool"] == "farm-expiter"
        and meta["kind"] == "policy"
        and meta["base_model"] == str(tiny_model_path)
    )
    assert meta["prompt_template"] == "chat" and list(meta["inputs"]) == [str(prompts)]
    rounds = meta["expert_iteration"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]
    # the budget: the reward model's labels (its meta.json), every sample drawn, every SFT token
    rm_records = json.loads((tmp_path / "rm" / "meta.json").read_text()).get("preferences")
    budget = check_budget(
        tmp_path / "policy",
        "expiter",
        (rm_records or {}).get("records"),
        within=time.monotonic() - began,
    )
    drawn = sum(
        s.completion_tokens + s.finished for _, scored in sampled for p in scored for s in p.samples
    )
    assert budget["tokens_sampled"] == drawn and budget["rounds"] == 2
    assert (
        [r["sampling_seed"] for r in rounds]
        == [r["training_seed"] for r in rounds]
        == [derive_seed(0, "expiter round", k) for k in (1, 2)]
    )
    assert rounds[0]["policy"] == str(tiny_model_path) and rounds[1]["policy"] == "round 1"
    assert all(r["prompts"] == 6 for r in rounds)
    assert (
        sampled[0][0] == str(tiny_model_path) and sampled[1][0] != sampled[0][0]
    )  # round 2 samples round 1's policy
    # SFT was taught exactly the winners: the highest of the 4 scores, recomputed apart, for each prompt
    scorer = RewardScorer(tmp_path / "rm", device="cpu", batch_size=3)
    for (_, scored), demonstrations, figures in zip(sampled, taught, rounds, strict=True):
        expected, best, first = [], [], []
        for prompt in scored:
            assert len(prompt.samples) == 4
            scores = scorer.score(
                [(prompt.record["instruction"], "", s.text) for s in prompt.samples],
                finished=[s.finished for s in prompt.samples],
            )
            top = max(scores)
            # one clear winning text, so "exactly" means something
            assert (
                len(
                    {
                        s.text
                        for s, score in zip(prompt.samples, scores, strict=True)
                        if score > top - 1e-4
                    }
                )
                == 1
            )
            expected.append(
                {
                    "instruction": prompt.record["instruction"],
                    "input": "",
                    "output": prompt.samples[scores.index(top)].text,
                }
            )
            best.append(top)
            first.append(scores[0])
        assert demonstrations == expected
        assert (
            sum(
                d["output"] != p.samples[0].text
                for d, p in zip(demonstrations, scored, strict=True)
            )
            >= 2
        )  # not the first samples
        assert figures["mean_reward_best_of_4"] == pytest.approx(sum(best) / len(best), abs=1e-4)
        assert figures["mean_reward_first_sample"] == pytest.approx(
            sum(first) / len(first), abs=1e-4
        )
    assert rounds[0]["sft"]["examples"] == 6 and rounds[0]["sft"]["steps"] == 2
    # metrics.jsonl (the one schema): SFT rows of both rounds, steps counted over the run, with each
    # round's rewards
    metrics = [
        json.loads(line)
        for line in (tmp_path / "policy" / "metrics.jsonl").read_text().splitlines()
    ]
    # (every step: a round of 2 steps is a short run, logged whole)
    assert [(row["method"], row["round"], row["step"]) for row in metrics] == [
        ("expiter", 1, 1),
        ("expiter", 1, 2),
        ("expiter", 2, 3),
        ("expiter", 2, 4),
    ]
    for row in metrics:
        figures = rounds[row["round"] - 1]
        assert row["reward"] == figures["mean_reward_first_sample"]
        assert row["best_of_n_reward"] == figures["mean_reward_best_of_4"] and row["n"] == 4
    # round 1's SFT logged each of its steps' loss; TRL's train_loss for the round is their mean
    # (meta.json is written by the last round's SFT, before that round's own figures exist)
    losses = [row["loss"] for row in metrics if row["round"] == 1]
    assert rounds[0]["sft"]["train_loss"] == pytest.approx(sum(losses) / len(losses), abs=1e-3)
    assert meta["training"]["steps"] == 2  # the last round's SFT, written by train_sft
    assert meta["expert_iteration"]["best_of_n"]["ns"] == [4]
    # intermediate rounds' policies went away with the run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy", "prompts.jsonl", "rm"]


def test_empty_prompts_are_an_error(tiny_model_path, tmp_path, capfd):
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    assert (
        run_main(
            expiter_main,
            [str(tiny_model_path), str(tiny_model_path), str(empty), "-o", str(tmp_path / "out")],
        )
        == 1
    )
    assert f"{empty}: no prompts" in capfd.readouterr().err
