"""farm-bon: best-of-n from one sampling pass; the chosen outputs are the highest-scored of the first
n samples by the reward model's scores recomputed apart, their rewards are what the reward model
gives their text, and on a task whose reward is known (answer "blue") best-of-4 finds it where one
sample does not. Real sampling from tiny policies, real scoring."""

from __future__ import annotations

import json

import pytest
from farmkit.tools.farm_bon import main as bon_main
from test_reward import run_main, train_keyword_rm, write_jsonl

PROMPTS = [
    {"instruction": f"Describe the garden number {i}", "input": "", "id": i, "topic": "garden"}
    for i in range(10)
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_model_path):
    """One farm-bon run with -n 1,4,16 and --all-samples, with its reward model and files. The
    policy is the tiny model made to end about one answer in seven at each token, so the samples
    hold finished and unfinished answers whatever the seed."""
    from policy_fixtures import ends_often

    folder = tmp_path_factory.mktemp("bon")
    train_keyword_rm(tiny_model_path, folder / "rm", pairs=96, epochs=2)
    ends_often(tiny_model_path, folder / "policy")
    prompts = write_jsonl(folder / "prompts.jsonl", PROMPTS)
    code = run_main(
        bon_main,
        [
            str(folder / "policy"),
            str(folder / "rm"),
            str(prompts),
            "-n",
            "16,1,4",
            "--max-new-tokens",
            "8",
            "--generation-batch-size",
            "64",
            "--all-samples",
            str(folder / "all.jsonl"),
            "-o",
            str(folder / "best.jsonl"),
            "--seed",
            "7",
            "-q",
        ],
    )
    assert code == 0
    best = [json.loads(line) for line in (folder / "best.jsonl").read_text().splitlines()]
    every = [json.loads(line) for line in (folder / "all.jsonl").read_text().splitlines()]
    return folder, best, every


def test_one_block_per_n_in_prompt_order(sweep):
    _, best, every = sweep
    name = "policy"
    assert [(r["generator"], r["best_of"], r["id"]) for r in best] == [
        (f"{name}-best-of-{n}", n, p["id"]) for n in (1, 4, 16) for p in PROMPTS
    ]
    assert all(
        r["topic"] == "garden" and r["instruction"] == PROMPTS[r["id"]]["instruction"] for r in best
    )  # fields pass through
    assert all(
        r["temperature"] == 1.0 and r["seed"] == 7 and r["reward_model"] == "rm" for r in best
    )
    assert best[0]["provenance"]["farm-bon"]["n"] == [1, 4, 16]
    assert [(r["id"], r["sample_index"]) for r in every] == [
        (p["id"], k) for p in PROMPTS for k in range(16)
    ]
    assert all(r["generator"] == name for r in every)


def test_chosen_output_is_the_best_of_the_first_n(sweep):
    _, best, every = sweep
    samples = {(r["id"], r["sample_index"]): r for r in every}
    for record in best:
        window = [samples[(record["id"], k)] for k in range(record["best_of"])]
        top = max(window, key=lambda r: r["reward"])
        assert record["reward"] == top["reward"]
        assert record["output"] == samples[(record["id"], record["sample_index"])]["output"]
        assert record["sample_index"] < record["best_of"]
    first = [r for r in best if r["best_of"] == 1]
    assert [r["sample_index"] for r in first] == [0] * len(PROMPTS)


def test_choice_is_the_argmax_of_scores_recomputed_apart(sweep):
    """Every sample rescored by a fresh scorer (other batch size, one text at a time for half of
    them): the chosen sample of each prompt and n holds the top score of the first n."""
    from farmkit.train.scoring import RewardScorer

    folder, best, every = sweep
    assert any(not r["finished"] for r in every) and any(
        r["finished"] for r in every
    )  # both kinds are scored
    scorer = RewardScorer(folder / "rm", device="cpu", batch_size=5)
    rescored = scorer.score(
        [(r["instruction"], r["input"], r["output"]) for r in every],
        finished=[r["finished"] for r in every],
    )
    by_sample = {
        (r["id"], r["sample_index"]): score for r, score in zip(every, rescored, strict=True)
    }
    moved = 0
    for record in best:
        window = [by_sample[(record["id"], k)] for k in range(record["best_of"])]
        assert by_sample[(record["id"], record["sample_index"])] == pytest.approx(
            max(window), abs=1e-4
        )
        assert record["reward"] == pytest.approx(max(window), abs=1e-4)
        moved += record["sample_index"] != 0
    assert moved >= len(PROMPTS)  # the choice is not simply the first sample


def test_best_of_n_finds_the_answer_a_known_reward_pays_for(tiny_model_path, tmp_path):
    """The tiny policy answers colours at random and the keyword reward model pays for a finished
    answer whose last word is "blue", and for nothing else: measured by that known rule, best-of-4
    is right far more often than one sample (1 - 0.75**4 = 0.68 against 0.25 if one colour is said)."""
    from policy_fixtures import KEYWORD, keyword_reward_model, prompt_records, tiny_sft

    policy = tiny_sft(tiny_model_path, tmp_path / "sft")
    rm = keyword_reward_model(tiny_model_path, tmp_path / "rm")
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl", [{**r, "id": i} for i, r in enumerate(prompt_records(32))]
    )
    code = run_main(
        bon_main,
        [
            str(policy),
            str(rm),
            str(prompts),
            "-n",
            "1,4",
            "--max-new-tokens",
            "4",
            "--generation-batch-size",
            "64",
            "-o",
            str(tmp_path / "best.jsonl"),
            "--seed",
            "0",
            "-q",
        ],
    )
    assert code == 0
    best = [json.loads(line) for line in (tmp_path / "best.jsonl").read_text().splitlines()]
    gold = {
        n: sum(r["finished"] and r["output"].endswith(KEYWORD) for r in best if r["best_of"] == n)
        / 32
        for n in (1, 4)
    }
    assert gold[4] >= gold[1] + 0.25, gold


def test_stored_rewards_are_the_reward_models_scores_of_the_text(sweep):
    from farmkit.train.scoring import RewardScorer

    folder, best, _ = sweep
    chosen = [r for r in best if r["best_of"] == 16]
    scorer = RewardScorer(folder / "rm", device="cpu", batch_size=3)
    rescored = scorer.score(
        [(r["instruction"], r["input"], r["output"]) for r in chosen],
        finished=[r["finished"] for r in chosen],
    )
    assert rescored == pytest.approx([r["reward"] for r in chosen], abs=1e-4)


def test_same_seed_same_bytes_other_seed_other_samples(sweep):
    folder, _, _ = sweep
    prompts = write_jsonl(folder / "three.jsonl", PROMPTS[:3])
    base = [
        str(folder / "policy"),
        str(folder / "rm"),
        str(prompts),
        "-n",
        "4",
        "--max-new-tokens",
        "8",
        "-q",
    ]
    assert run_main(bon_main, [*base, "--seed", "7", "-o", str(folder / "again.jsonl")]) == 0
    assert run_main(bon_main, [*base, "--seed", "8", "-o", str(folder / "other.jsonl")]) == 0
    assert run_main(bon_main, [*base, "--seed", "7", "-o", str(folder / "again2.jsonl")]) == 0
    assert (folder / "again.jsonl").read_bytes() == (folder / "again2.jsonl").read_bytes()
    assert (folder / "again.jsonl").read_bytes() != (folder / "other.jsonl").read_bytes()


def test_bad_n_is_a_usage_error(tiny_model_path, tmp_path):
    assert (
        run_main(bon_main, [str(tiny_model_path), str(tiny_model_path), "-", "-n", "4,zero"]) == 2
    )
    assert run_main(bon_main, [str(tiny_model_path), str(tiny_model_path), "-", "-n", "0"]) == 2
