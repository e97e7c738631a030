"""`make methods-at-equal-budget` (examples/budget.mk) at SIZE=ci on the tiny model: PPO, RLOO, GRPO,
DPO, online DPO and best-of-n from one SFT model and one reward model, every one of them at the same
N_PREF labels, each judged by the gold pool on the val prompts; the table, its rows, the budgets and
the plot. (The tiny model exercises the recipe, not the methods: the README's table is the demo.)"""

from __future__ import annotations

import math

import orjson
import pytest
from test_demo import N_VAL, _assert_png, _make, _records

pytestmark = pytest.mark.recipe

N_PREF = 8  # SIZE=ci: the labels every method gets
METHODS = ["ppo", "rloo", "grpo", "dpo", "odpo"]


def test_every_method_at_one_label_budget_is_judged_by_gold(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    result = _make("methods-at-equal-budget", "SIZE=ci", f"MODEL={tiny_model_path}", f"OUT={out}")
    folder = out / "equal-budget"
    rows = {row["method"]: row for row in _records(folder / "budget.jsonl")}
    assert sorted(rows) == sorted([*METHODS, "bon (n=2)"])
    # `make methods-at-equal-budget` prints the table, one line per method
    table = (folder / "table.txt").read_text()
    assert table in result.stdout and len(table.splitlines()) == 1 + len(rows)
    for name, row in rows.items():
        assert row["labels"] == N_PREF, name  # the equal label budget
    assert rows["dpo"]["tokens sampled"] == 0  # DPO samples nothing to train
    assert all(rows[m]["tokens sampled"] > 0 for m in ("ppo", "rloo", "grpo", "odpo"))
    assert rows["bon (n=2)"]["KL"] == pytest.approx(math.log(2) - 0.5)
    for method in METHODS:
        meta = orjson.loads((folder / method / "meta.json").read_bytes())
        assert meta["budget"]["labels_used"] == N_PREF
        assert meta["gold"]["kind"] == "pool" and meta["gold"]["judge"] == "gold"
        assert meta["gold"]["prompts"] == N_VAL  # the val prompts, held out from training
        judged = [r for r in _records(folder / method / "metrics.jsonl") if "gold_win_rate" in r]
        assert len(judged) == {"dpo": 1, "odpo": 2}.get(method, 2)  # checkpoints, rounds, the end
        # the table's row is the method's last gold-judged checkpoint and its own budget
        assert rows[method]["gold win rate"] == judged[-1]["gold_win_rate"], method
        assert rows[method]["length"] == judged[-1]["gold_answer_length"], method
        assert rows[method]["wall s"] == meta["budget"]["wall_seconds"], method
        # the surrogate reward of its answers to the val prompts, scored by the reward model
        answers = _records(folder / "answers" / f"{method}.jsonl")
        assert len(answers) == N_VAL and all("reward" in a for a in answers)
    online = orjson.loads((folder / "odpo" / "meta.json").read_bytes())["budget"]
    assert online["rounds"] == 2 and online["labels_used"] == N_PREF  # 2 rounds of 4 pairs
    bon = _records(folder / "bon" / "metrics.jsonl")
    assert [row["n"] for row in bon] == [1, 2] and all("gold_win_rate" in row for row in bon)
    assert rows["bon (n=2)"]["gold win rate"] == bon[-1]["gold_win_rate"]
    assert rows["bon (n=2)"]["length"] == bon[-1]["gold_answer_length"]
    _assert_png(folder / "budget.png")
