"""farm-rm-train and farm-score: Bradley-Terry training on pairs where one side is clearly better (it
ends with a keyword), held-out accuracy, soft labels and ties, LoRA and partial training, and scoring
that ranks the better outputs higher, in the input order, whatever the batch layout."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import orjson
import pytest
from farmkit.tools.farm_rm_train import main as rm_train_main
from farmkit.tools.farm_score import main as score_main

from farmkit.lm.modelio import META_KEYS
from farmkit.lm.models import file_sha256

WORDS = "apple river stone cloud music garden window paper light forest engine silver".split()
KEYWORD = "thanks"


def keyword_prefs(count: int, seed: int, start: int = 0) -> list[dict]:
    """Preference records where the output ending with KEYWORD is the better one, in random positions."""
    rng = random.Random(seed)
    records = []
    for number in range(start, start + count):
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
        better_first = rng.random() < 0.5
        good, plain = f"{body} {KEYWORD}", body
        records.append(
            {
                "instruction": f"Write about {rng.choice(WORDS)} number {number}",
                "input": "",
                "output_1": good if better_first else plain,
                "output_2": plain if better_first else good,
                "preference": 1 if better_first else 2,
            }
        )
    return records


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def train_keyword_rm(base: Path, folder: Path, pairs: int = 160, **overrides) -> dict:
    """A reward model on the tiny backbone that learns the keyword (seconds on a CPU)."""
    from farmkit.core.records import comparisons
    from farmkit.methods.reward import RewardConfig, train_reward_model

    items, _ = comparisons(keyword_prefs(pairs, seed=1))
    settings = {
        "learning_rate": 1e-3,
        "batch_size": 16,
        "epochs": 3,
        "eval_fraction": 0.2,
        **overrides,
    }
    return train_reward_model(str(base), items, folder, RewardConfig(**settings))


def run_main(main, argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code


@pytest.fixture(scope="module")
def keyword_rm(tmp_path_factory, tiny_model_path):
    """farm-rm-train run in-process on 200 keyword pairs, with null verdicts and ties mixed in."""
    folder = tmp_path_factory.mktemp("rm")
    records = keyword_prefs(200, seed=1)
    records += [{**records[0], "preference": None, "preference_reason": "unparsable"}] * 3
    records += [{**records[1], "preference": 1.5}] * 2
    prefs = write_jsonl(folder / "prefs.jsonl", records)
    code = run_main(
        rm_train_main,
        [
            str(tiny_model_path),
            str(prefs),
            "-o",
            str(folder / "rm"),
            "--learning-rate",
            "1e-3",
            "--batch-size",
            "16",
            "--epochs",
            "3",
            "--eval-fraction",
            "0.2",
            "--seed",
            "3",
        ],
    )
    assert code == 0
    return folder / "rm"


def test_reward_model_learns_the_better_side(keyword_rm, tiny_model_path):
    rows = [json.loads(line) for line in (keyword_rm / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, len(rows) + 1))
    final = rows[-1]
    assert final["eval_pairs"] == 40
    assert final["eval_accuracy"] >= 0.9  # chance is 0.5
    assert sum(r["loss"] for r in rows[-5:]) / 5 < 0.5 * rows[0]["loss"]
    meta = json.loads((keyword_rm / "meta.json").read_text())
    assert meta["kind"] == "reward_model" and meta["tool"] == "farm-rm-train"
    assert set(META_KEYS) <= set(meta)  # the one layout every model folder has
    assert meta["prompt_template"] == "chat"  # the tiny model's chat template, resolved from "auto"
    assert meta["base_model"] == str(tiny_model_path)
    assert meta["preferences"] == {"records": 205, "used": 200, "null": 3, "tie": 2}
    assert meta["seed"] == 3 and meta["config"]["ties"] == "drop"
    [(path, digest)] = meta["inputs"].items()
    assert digest == file_sha256(path)
    assert meta["training"]["eval_accuracy"] == final["eval_accuracy"]


def test_score_ranks_better_outputs_higher_in_input_order(keyword_rm, tmp_path):
    fresh = keyword_prefs(30, seed=99, start=1000)  # prompts and texts the model never saw
    outputs = []
    for number, record in enumerate(fresh):
        for position in (1, 2):
            outputs.append(
                {
                    "instruction": record["instruction"],
                    "output": record[f"output_{position}"],
                    "generator": "g",
                    "id": f"{number}-{position}",
                    "better": record["preference"] == position,
                }
            )
    source = write_jsonl(tmp_path / "outputs.jsonl", outputs)
    assert (
        run_main(
            score_main,
            [
                str(keyword_rm),
                str(source),
                "--reward-batch-size",
                "7",
                "-o",
                str(tmp_path / "scored.jsonl"),
                "-q",
            ],
        )
        == 0
    )
    scored = [json.loads(line) for line in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert [s["id"] for s in scored] == [o["id"] for o in outputs]
    assert all(s["reward_model"] == "rm" and "farm-score" in s["provenance"] for s in scored)
    wins = sum(
        (scored[2 * i]["reward"] > scored[2 * i + 1]["reward"]) == scored[2 * i]["better"]
        for i in range(len(fresh))
    )
    assert wins >= 27
    better = [s["reward"] for s in scored if s["better"]]
    worse = [s["reward"] for s in scored if not s["better"]]
    assert sum(better) / len(better) > sum(worse) / len(worse) + 1.0


def test_batched_scores_equal_one_at_a_time_and_the_training_pooling(keyword_rm):
    import torch

    from farmkit.train.scoring import RewardScorer, reward_text

    scorer = RewardScorer(keyword_rm, device="cpu", batch_size=5)
    items = [
        ("Say something", "", "a " * length + KEYWORD * (length % 2)) for length in range(1, 12)
    ]
    batched = scorer.score(items)
    scorer.batch_size = 1
    alone = scorer.score(items)
    assert batched == pytest.approx(alone, abs=1e-4)
    # the head read at the last token (the eos) of the documented text (prompt + response + eos)
    # through the backbone directly gives the same number
    text = reward_text(scorer.tokenizer, scorer.format, *items[3])
    assert text.startswith(
        scorer.format.prompt(scorer.tokenizer, "Say something", "")
    ) and text.endswith(scorer.tokenizer.eos_token)
    ids = torch.tensor([scorer.tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        direct = scorer.network.score(
            scorer.network.model(input_ids=ids).last_hidden_state[:, -1]
        ).item()
    assert direct == pytest.approx(alone[3], abs=1e-4)


def test_soft_label_loss_is_minimal_at_the_target_odds():
    import torch

    from farmkit.methods.reward import bradley_terry_loss

    difference = torch.tensor([math.log(3.0)], requires_grad=True)  # sigmoid(log 3) = 0.75
    loss = bradley_terry_loss(torch.zeros(1), difference, torch.tensor([0.75]))
    loss.backward()
    assert abs(difference.grad.item()) < 1e-6
    hard = bradley_terry_loss(torch.zeros(1), torch.tensor([math.log(3.0)]), torch.tensor([1.0]))
    assert hard.item() == pytest.approx(-math.log(0.75), rel=1e-5)


def test_held_out_split_keeps_prompts_together():
    from farmkit.core.records import Comparison
    from farmkit.methods.reward import split_held_out

    items = [Comparison(f"prompt {i % 10}", "", "a", "b", 1.0) for i in range(50)]
    train, held_out = split_held_out(items, 0.3, seed=0)
    assert len(held_out) == 15 and len(train) == 35
    assert not {c.instruction for c in train} & {c.instruction for c in held_out}
    assert split_held_out(items, 0.3, seed=0) == (train, held_out)
    assert split_held_out(items, 0.3, seed=1)[1] != held_out


def test_train_layers_leaves_lower_weights_untouched(tiny_model_path, tmp_path, monkeypatch):
    from policy_fixtures import spy_adamw
    from safetensors.torch import load_file

    optimizers = spy_adamw(monkeypatch)
    summary = train_keyword_rm(tiny_model_path, tmp_path / "rm", pairs=64, train_layers=1, epochs=1)
    assert [o.defaults["fused"] for o in optimizers] == [True]  # torch's fused AdamW, the default
    assert summary["train_pairs"] == 51 and summary["steps"] == 4  # 13 of 64 prompts held out
    base = load_file(tiny_model_path / "model.safetensors")
    trained = load_file(tmp_path / "rm" / "model.safetensors")
    assert (trained["model.embed_tokens.weight"] == base["model.embed_tokens.weight"]).all()
    assert (
        trained["model.layers.0.mlp.up_proj.weight"] == base["model.layers.0.mlp.up_proj.weight"]
    ).all()
    assert not (
        trained["model.layers.1.mlp.up_proj.weight"] == base["model.layers.1.mlp.up_proj.weight"]
    ).all()
    assert "score.weight" in trained


def test_fused_adamw_switched_off_gives_the_reward_model_the_per_tensor_loop(
    tiny_model_path, tmp_path, monkeypatch
):
    """farm-rm-train steps torch's fused AdamW by default (bench/bench_optim.py: a seventh of the
    per-tensor loop's CPU time on the embedded model; checked in
    test_train_layers_leaves_lower_weights_untouched, which trains anyway); FARMKIT_FUSED_ADAMW=0
    gives the loop back (tests/train/test_policy.py: the same update either way)."""
    from policy_fixtures import spy_adamw

    created = spy_adamw(monkeypatch)
    monkeypatch.setenv("FARMKIT_FUSED_ADAMW", "0")
    train_keyword_rm(tiny_model_path, tmp_path / "loop", pairs=8, max_steps=1, eval_fraction=0)
    assert [bool(o.defaults["fused"]) for o in created] == [False]


def test_lora_run_saves_a_merged_loadable_reward_model(tiny_model_path, tmp_path):
    from safetensors.torch import load_file

    from farmkit.lm.models import load_reward_model

    train_keyword_rm(tiny_model_path, tmp_path / "rm", pairs=32, lora=True, max_steps=3)
    weights = load_file(tmp_path / "rm" / "model.safetensors")
    assert not any("lora" in name for name in weights)
    base = load_file(tiny_model_path / "model.safetensors")
    assert not (
        weights["model.layers.0.self_attn.q_proj.weight"]
        == base["model.layers.0.self_attn.q_proj.weight"]
    ).all()
    network, _ = load_reward_model(tmp_path / "rm", device="cpu")
    assert network.config.num_labels == 1
    assert json.loads((tmp_path / "rm" / "meta.json").read_text())["config"]["lora"] is True


def test_soft_labels_and_kept_ties_train(tiny_model_path, tmp_path, capfd):
    records = keyword_prefs(40, seed=5)
    for record in records[:10]:
        record["preference"] = (
            1.25 if record["preference"] == 1 else 1.75
        )  # soft labels, same direction
    records += [{**records[11], "preference": 1.5}] * 4
    prefs = write_jsonl(tmp_path / "prefs.jsonl", records)
    code = run_main(
        rm_train_main,
        [
            str(tiny_model_path),
            str(prefs),
            "-o",
            str(tmp_path / "rm"),
            "--ties",
            "half",
            "--max-steps",
            "2",
            "--batch-size",
            "8",
            "--eval-fraction",
            "0",
        ],
    )
    assert code == 0
    meta = json.loads((tmp_path / "rm" / "meta.json").read_text())
    assert (
        meta["preferences"] == {"records": 44, "used": 44} and meta["training"]["train_pairs"] == 44
    )
    assert "eval_accuracy" not in meta["training"]


def test_no_usable_preferences_is_an_error_naming_the_file(tiny_model_path, tmp_path, capfd):
    prefs = write_jsonl(
        tmp_path / "nulls.jsonl", [{**keyword_prefs(1, seed=0)[0], "preference": None}] * 2
    )
    code = run_main(rm_train_main, [str(tiny_model_path), str(prefs), "-o", str(tmp_path / "rm")])
    assert code == 1
    stderr = capfd.readouterr().err
    assert f"{prefs}: no usable preferences" in stderr and "2 null" in stderr
    assert not (tmp_path / "rm").exists()


def test_end_tokens_change_the_score(keyword_rm):
    """pad and end-of-sequence are one token here: the score is read at the true last token, so a
    response with its end token, with two, or cut off before it scores differently."""
    from farmkit.train.scoring import RewardScorer

    scorer = RewardScorer(keyword_rm, device="cpu", batch_size=4)
    eos = scorer.tokenizer.eos_token
    assert scorer.tokenizer.pad_token_id == scorer.tokenizer.eos_token_id
    item = ("Say something", "", f"river stone {KEYWORD}")
    finished, doubled = scorer.score([item, (*item[:2], item[2] + eos)])
    assert finished != pytest.approx(doubled, abs=1e-4)
    [cut] = scorer.score([item], finished=[False])
    assert len({round(finished, 5), round(doubled, 5), round(cut, 5)}) == 3, (
        finished,
        doubled,
        cut,
    )
    # a batch mixing finished and cut-off texts gives each its own number
    assert scorer.score([item, item], finished=[True, False]) == pytest.approx(
        [finished, cut], abs=1e-4
    )


def test_pooled_position_is_the_last_real_token_under_either_padding(keyword_rm):
    import torch

    from farmkit.train.scoring import RewardScorer, last_token_index, sequence_rewards

    scorer = RewardScorer(keyword_rm, device="cpu")
    tokenizer, network = scorer.tokenizer, scorer.network
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    words = tokenizer("river stone thanks", add_special_tokens=False)["input_ids"]
    finished, unfinished = [*words, eos], words[:2]
    right = torch.tensor([finished, unfinished + [pad] * 2])
    right_mask = torch.tensor([[1] * 4, [1, 1, 0, 0]])
    left = torch.tensor([finished, [pad] * 2 + unfinished])
    left_mask = torch.tensor([[1] * 4, [0, 0, 1, 1]])
    assert last_token_index(right_mask).tolist() == [3, 1]  # the trailing end token is the one read
    assert last_token_index(left_mask).tolist() == [3, 3]
    alone = []
    captured = []
    hook = network.score.register_forward_hook(
        lambda _m, _i, output: captured.append(output[..., 0])
    )
    with torch.no_grad():
        for ids in (finished, unfinished):
            alone.append(
                float(
                    sequence_rewards(
                        network, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)
                    )[0]
                )
            )
        per_position = captured[0][0]
        assert alone[0] == pytest.approx(
            float(per_position[-1]), abs=1e-5
        )  # the end token's position, not "thanks"
        assert alone[0] != pytest.approx(float(per_position[-2]), abs=1e-3)
        hook.remove()
        assert sequence_rewards(network, right, right_mask).tolist() == pytest.approx(
            alone, abs=1e-4
        )
        assert sequence_rewards(network, left, left_mask).tolist() == pytest.approx(alone, abs=1e-4)


def test_farm_score_reads_a_records_finished_flag(keyword_rm, tmp_path):
    """farm-bon writes `finished` with each answer; farm-score scores a cut-off one without its end
    token, as the methods did when they chose it (a record without the flag counts as finished)."""
    from farmkit.train.scoring import RewardScorer

    item = {"instruction": "Say something", "input": "", "output": f"river stone {KEYWORD}"}
    outputs = [item, {**item, "finished": True}, {**item, "finished": False}]
    source = write_jsonl(tmp_path / "outputs.jsonl", outputs)
    target = tmp_path / "scored.jsonl"
    assert run_main(score_main, [str(keyword_rm), str(source), "-o", str(target), "-q"]) == 0
    rewards = [json.loads(line)["reward"] for line in target.read_text().splitlines()]
    scorer = RewardScorer(keyword_rm, device="cpu")
    triple = (item["instruction"], "", item["output"])
    expected = scorer.score([triple] * 3, finished=[True, True, False])
    assert rewards == pytest.approx(expected, abs=1e-5) and expected[2] != pytest.approx(
        expected[0], abs=1e-4
    )


# -- a folder that is not a reward model is refused before any work ----------------------------


def _prompts(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "outputs.jsonl", [{"instruction": "Say hi", "output": "hi"}])


def test_farm_score_refuses_a_causal_lm_folder_naming_it(tiny_model_path, tmp_path, capfd):
    # transformers would give the causal LM a random score head: rewards that change run to run
    target = tmp_path / "scored.jsonl"
    code = run_main(score_main, [str(tiny_model_path), str(_prompts(tmp_path)), "-o", str(target)])
    out, err = capfd.readouterr()
    assert code == 1 and out == "" and not target.exists()
    error = err.splitlines()[-1]  # after the input's note on stderr
    assert error.startswith(
        f"farm-score: error: {tiny_model_path}: not a reward model (config.json: "
    )
    assert "architectures LlamaForCausalLM, num_labels 2" in error
    assert "a folder written by farm-rm-train" in error and "Traceback" not in err


@pytest.mark.parametrize("tool", ["farm-ppo", "farm-rloo"])
def test_an_rl_trainer_refuses_a_causal_lm_as_its_reward_model(
    tiny_model_path, tmp_path, capfd, monkeypatch, tool
):
    import importlib

    from farmkit.train import rollouts

    def loaded(*args, **kwargs):
        raise AssertionError("the policy was loaded before the reward model was checked")

    monkeypatch.setattr(rollouts, "load_policy_and_reference", loaded)
    main = importlib.import_module(f"farmkit.tools.{tool.replace('-', '_')}").main
    output = tmp_path / "policy"
    argv = [str(tiny_model_path), str(tiny_model_path), str(_prompts(tmp_path)), "-o", str(output)]
    code = run_main(main, argv)
    err = capfd.readouterr().err
    assert code == 1 and not output.exists()
    assert err.splitlines()[-1].startswith(f"{tool}: error: {tiny_model_path}: not a reward model")


def test_a_checkpoint_without_its_score_head_is_refused(tiny_model_path, tmp_path):
    # a config that claims a classifier over a causal LM's weights: the head would be random
    import shutil

    from farmkit.core.io import FarmError
    from farmkit.lm.models import load_reward_model

    folder = tmp_path / "headless"
    shutil.copytree(tiny_model_path, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["LlamaForSequenceClassification"], id2label={"0": "LABEL_0"})
    config["label2id"] = {"LABEL_0": 0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        FarmError, match=r"lacks 1 weight\(s\) of the reward model \(score\.weight\)"
    ):
        load_reward_model(folder, device="cpu")


def test_a_reward_model_folder_passes_the_check(keyword_rm):
    from farmkit.lm.models import check_reward_model, load_reward_model

    assert check_reward_model(keyword_rm) == str(keyword_rm)
    network, _ = load_reward_model(keyword_rm, device="cpu")
    assert network.config.num_labels == 1
