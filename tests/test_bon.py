"""farm-bon: best-of-n from one sampling pass; the chosen outputs are the highest-scored of the first
n samples, their rewards are what the reward model gives their text, and the sweep's mean reward
rises with n. Real sampling from the tiny policy, real scoring with a reward model trained here."""

from __future__ import annotations

import json

import pytest
from farmkit.tools.farm_bon import main as bon_main
from test_reward import run_main, train_keyword_rm, write_jsonl

PROMPTS = [{"instruction": f"Describe the garden number {i}", "input": "", "id": i, "topic": "garden"} for i in range(10)]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_model_path):
    """One farm-bon run with -n 1,4,16 and --all-samples, with its reward model and files."""
    folder = tmp_path_factory.mktemp("bon")
    train_keyword_rm(tiny_model_path, folder / "rm", pairs=96, epochs=2)
    prompts = write_jsonl(folder / "prompts.jsonl", PROMPTS)
    code = run_main(bon_main, [str(tiny_model_path), str(folder / "rm"), str(prompts), "-n", "16,1,4", "--max-new-tokens", "8", "--batch-size", "64",
                               "--all-samples", str(folder / "all.jsonl"), "-o", str(folder / "best.jsonl"), "--seed", "7", "-q"])
    assert code == 0
    best = [json.loads(line) for line in (folder / "best.jsonl").read_text().splitlines()]
    every = [json.loads(line) for line in (folder / "all.jsonl").read_text().splitlines()]
    return folder, best, every


def test_one_block_per_n_in_prompt_order(sweep, tiny_model_path):
    _, best, every = sweep
    name = tiny_model_path.name
    assert [(r["generator"], r["best_of"], r["id"]) for r in best] == [
        (f"{name}-best-of-{n}", n, p["id"]) for n in (1, 4, 16) for p in PROMPTS
    ]
    assert all(r["topic"] == "garden" and r["instruction"] == PROMPTS[r["id"]]["instruction"] for r in best)  # fields pass through
    assert all(r["temperature"] == 1.0 and r["seed"] == 7 and r["reward_model"] == "rm" for r in best)
    assert best[0]["provenance"]["farm-bon"]["n"] == [1, 4, 16]
    assert [(r["id"], r["sample_index"]) for r in every] == [(p["id"], k) for p in PROMPTS for k in range(16)]
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


def test_mean_reward_rises_with_n_and_beats_the_first_sample(sweep):
    _, best, _ = sweep
    means = {n: sum(r["reward"] for r in best if r["best_of"] == n) / len(PROMPTS) for n in (1, 4, 16)}
    assert means[1] <= means[4] <= means[16]
    assert means[16] > means[1]


def test_stored_rewards_are_the_reward_models_scores_of_the_text(sweep):
    from farmkit.methods.reward import RewardScorer

    folder, best, _ = sweep
    chosen = [r for r in best if r["best_of"] == 16]
    scorer = RewardScorer(folder / "rm", device="cpu", batch_size=3)
    rescored = scorer.score([(r["instruction"], r["input"], r["output"]) for r in chosen])
    assert rescored == pytest.approx([r["reward"] for r in chosen], abs=1e-4)


def test_same_seed_same_bytes_other_seed_other_samples(sweep, tiny_model_path):
    folder, _, _ = sweep
    prompts = write_jsonl(folder / "three.jsonl", PROMPTS[:3])
    base = [str(tiny_model_path), str(folder / "rm"), str(prompts), "-n", "4", "--max-new-tokens", "8", "-q"]
    assert run_main(bon_main, [*base, "--seed", "7", "-o", str(folder / "again.jsonl")]) == 0
    assert run_main(bon_main, [*base, "--seed", "8", "-o", str(folder / "other.jsonl")]) == 0
    assert run_main(bon_main, [*base, "--seed", "7", "-o", str(folder / "again2.jsonl")]) == 0
    assert (folder / "again.jsonl").read_bytes() == (folder / "again2.jsonl").read_bytes()
    assert (folder / "again.jsonl").read_bytes() != (folder / "other.jsonl").read_bytes()


def test_bad_n_is_a_usage_error(tiny_model_path, tmp_path):
    assert run_main(bon_main, [str(tiny_model_path), str(tiny_model_path), "-", "-n", "4,zero"]) == 2
    assert run_main(bon_main, [str(tiny_model_path), str(tiny_model_path), "-", "-n", "0"]) == 2
