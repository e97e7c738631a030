"""The over-optimization study's recipe (examples/Makefile `overopt`) at SIZE=ci on the tiny model:
its own split and SFT, the same pairs labelled by the noisy pool and by the single judge, two reward
models, a best-of-n sweep reranking one sampling pass, PPO checkpoints against each reward model, gold
win rates, the table and the plot. (The tiny model exercises the recipe; `make overopt` is the study.)"""

from __future__ import annotations

import orjson
import pytest
from test_demo import N_VAL, _assert_png, _make, _records

pytestmark = pytest.mark.recipe


def test_overopt_recipe_sweeps_best_of_n_and_ppo_checkpoints_for_both_reward_models(
    tmp_path, tiny_model_path
):
    out = tmp_path / "run"
    result = _make("overopt", "SIZE=ci", f"MODEL={tiny_model_path}", f"OUT={out}")
    study = out / "overopt"
    rows = _records(study / "overopt.jsonl")
    systems = [row for row in rows if "system" in row]
    agreement = [row for row in rows if "pairwise_agreement_with_gold" in row]
    compared = {row["comparison"]: row for row in rows if "comparison" in row}
    assert result.stdout.count('"system"') == len(systems)  # `make overopt` prints the table
    for model in ("pool", "single"):
        bon = sorted(
            (
                row
                for row in systems
                if row["reward_model"] == model and row["method"] == "best-of-n"
            ),
            key=lambda r: r["n"],
        )
        assert [row["n"] for row in bon] == [1, 2, 4]
        # the best of the first n samples can only score higher as n grows: the rerank is right
        rewards = [row["surrogate_reward"] for row in bon]
        assert rewards == sorted(rewards), rewards
        ppo = [row for row in systems if row["reward_model"] == model and row["method"] == "ppo"]
        assert sorted(row["step"] for row in ppo) == [1, 2]
        for row in bon + ppo:
            assert 0 <= row["gold_win_rate"] <= 100 and 0 <= row["gold_reward"] <= 1
    assert len(agreement) == 2
    assert sorted(compared) == sorted(
        [
            "pool-best-of-4 - pool-best-of-1",
            "pool-best-of-4 - pool-best-of-2",
            "single-best-of-4 - single-best-of-1",
            "single-best-of-4 - single-best-of-2",
            "single-best-of-4 - pool-best-of-4",
        ]
    )
    for row in compared.values():
        assert (
            row["prompts"] == N_VAL and row["ci95"][0] <= row["mean_difference"] <= row["ci95"][1]
        )
    for row in agreement:
        assert row["samples"] == N_VAL * 4 and 0 <= row["pairwise_agreement_with_gold"] <= 1
    # both reward models were trained on the same pairs, labelled differently
    pool, single = (_records(study / f"prefs_{name}.jsonl") for name in ("pool", "single"))
    assert [(p["output_1"], p["output_2"]) for p in pool] == [
        (p["output_1"], p["output_2"]) for p in single
    ]
    assert {p["provenance"]["farm-annotate"]["pool"] for p in pool} == {"sim_ann_offline"}
    assert {
        (p["provenance"]["farm-annotate"]["pool"], p["provenance"]["farm-annotate"]["noised"])
        for p in single
    } == {("single_offline", False)}
    # every system was judged against the same reference answers on the val prompts
    board = {row["generator"]: row for row in _records(study / "leaderboard_gold.jsonl")}
    assert {row["system"] for row in systems} <= set(board)
    assert all(row["n_total"] + row.get("n_dropped", 0) == N_VAL for row in board.values())
    _assert_png(study / "overopt.png")
    # the trained folders are kept whole (make must not delete them as intermediates) ...
    for model in ("pool", "single"):
        assert (
            orjson.loads((study / f"rm_{model}" / "meta.json").read_bytes())["kind"]
            == "reward_model"
        )
        assert (study / f"ppo_{model}" / "meta.json").is_file()
    # ... so a second make has nothing to redo
    planned = _make(
        "-n", "overopt-results", "SIZE=ci", f"MODEL={tiny_model_path}", f"OUT={out}"
    ).stdout
    assert "farm-" not in planned, planned
