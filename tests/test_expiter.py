"""farm-expiter: best-of-n with a reward model, then SFT on the winners, for two rounds. The folder
loads as a policy, its weights moved, and meta.json records both steps of every round."""

from __future__ import annotations

import json

from farmkit.tools.farm_expiter import main as expiter_main
from test_reward import run_main, train_keyword_rm, write_jsonl

from farmkit.generation import Sample
from farmkit.methods.bon import ScoredPrompt
from farmkit.methods.expiter import winners


def test_winners_are_the_best_of_the_first_n():
    prompt = ScoredPrompt({"instruction": "x", "input": None}, [Sample(t, 1, 1, True) for t in "abcd"], [0.1, 0.9, 0.5, 2.0])
    assert winners([prompt], 3) == [{"instruction": "x", "input": "", "output": "b"}]
    assert winners([prompt], 4)[0]["output"] == "d"


def test_two_rounds_write_a_trained_policy_with_both_steps_recorded(tiny_model_path, tmp_path):
    from safetensors.torch import load_file

    from farmkit.models import load_causal_lm

    train_keyword_rm(tiny_model_path, tmp_path / "rm", pairs=64, epochs=1)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"instruction": f"Describe river {i}", "input": ""} for i in range(6)])
    code = run_main(expiter_main, [str(tiny_model_path), str(tmp_path / "rm"), str(prompts), "-o", str(tmp_path / "policy"),
                                   "-n", "4", "--rounds", "2", "--max-new-tokens", "8", "--max-steps", "2",
                                   "--learning-rate", "1e-3", "--batch-size", "6", "-q"])
    assert code == 0
    network, _ = load_causal_lm(tmp_path / "policy", device="cpu")
    assert network.config.num_hidden_layers == 2
    base = load_file(tiny_model_path / "model.safetensors")
    trained = load_file(tmp_path / "policy" / "model.safetensors")
    assert not (trained["model.layers.1.mlp.down_proj.weight"] == base["model.layers.1.mlp.down_proj.weight"]).all()

    meta = json.loads((tmp_path / "policy" / "meta.json").read_text())
    assert meta["tool"] == "farm-expiter" and meta["kind"] == "policy" and meta["base_model"] == str(tiny_model_path)
    assert meta["prompt_template"] == "chat" and list(meta["inputs"]) == [str(prompts)]
    rounds = meta["expert_iteration"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2] and [r["sampling_seed"] for r in rounds] == [0, 1]
    assert rounds[0]["policy"] == str(tiny_model_path) and rounds[1]["policy"] == "round 1"
    assert all(r["prompts"] == 6 and r["mean_reward_best_of_4"] >= r["mean_reward_first_sample"] for r in rounds)
    assert rounds[0]["sft"]["examples"] == 6 and rounds[0]["sft"]["steps"] == 2
    assert meta["training"]["steps"] == 2  # the last round's SFT, written by train_sft
    assert meta["expert_iteration"]["best_of_n"]["ns"] == [4]
    # intermediate rounds' policies went away with the run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy", "prompts.jsonl", "rm"]


def test_empty_prompts_are_an_error(tiny_model_path, tmp_path, capfd):
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    assert run_main(expiter_main, [str(tiny_model_path), str(tiny_model_path), str(empty), "-o", str(tmp_path / "out")]) == 1
    assert f"{empty}: no prompts" in capfd.readouterr().err
