"""Options every trainer shares (issue 22): --device on each of them (a bad name is a usage error
before any work, a device that is not there a one-line error, --device cpu runs), --save-steps and
--resume on farm-dpo, farm-rm-train and farm-quark (an interrupted run resumed ends with the weights
of an unbroken one), and LoRA on farm-quark and farm-expiter."""

from __future__ import annotations

import importlib
import json

import click
import pytest
import torch
from conftest import run_tool
from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft, write_jsonl
from test_dpo import preference_records

# the trainers and the arguments that come before their options
HEADS = {
    "farm-sft": ["m", "d", "-o", "o"],
    "farm-rm-train": ["m", "p", "-o", "o"],
    "farm-dpo": ["m", "p", "-o", "o"],
    "farm-online-dpo": ["m", "p", "-o", "o"],
    "farm-ppo": ["s", "r", "p", "-o", "o"],
    "farm-rloo": ["s", "r", "p", "-o", "o"],
    "farm-grpo": ["s", "r", "p", "-o", "o"],
    "farm-quark": ["s", "r", "p", "-o", "o"],
    "farm-expiter": ["s", "r", "p", "-o", "o"],
}


def command(tool: str) -> click.Command:
    return importlib.import_module(f"farmkit.tools.{tool.replace('-', '_')}").cli


@pytest.mark.parametrize("tool", sorted(HEADS))
def test_every_trainer_takes_device(tool):
    cmd = command(tool)
    for device in ("cpu", "cuda", "cuda:1", "auto"):
        with cmd.make_context(tool, [*HEADS[tool], "--device", device]) as context:
            assert context.params["device"] == device
    for bad in ("gpu", "cuda:x", "cuda1"):
        with pytest.raises(click.BadParameter, match="expected auto, cpu, cuda, cuda:N"):
            cmd.make_context(tool, [*HEADS[tool], "--device", bad])


@pytest.mark.heavy  # a process each, importing torch
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("tool", ["farm-dpo", "farm-rm-train", "farm-grpo"])
def test_a_device_that_is_not_there_is_a_one_line_error(tool, tmp_path):
    prefs = write_jsonl(tmp_path / "prefs.jsonl", preference_records())
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(4))
    inputs = ["sft", "rm", str(prompts)] if tool == "farm-grpo" else ["sft", str(prefs)]
    result = run_tool(tool, *inputs, "-o", str(tmp_path / "out"), "--device", "cuda:1")
    assert result.returncode == 1, result.stderr.decode()
    last = result.stderr.decode().strip().splitlines()[-1]
    assert last.startswith(f"{tool}: error: --device cuda:1: no CUDA GPU is visible to torch")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def models(tiny_model_path, tmp_path_factory):
    sft = tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft"))
    return sft, keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm"))


@pytest.mark.parametrize("tool", ["farm-dpo", "farm-rm-train", "farm-grpo"])
def test_device_cpu_trains_and_writes_a_loadable_folder(tool, models, tmp_path):
    """farm-dpo and farm-rm-train run with --resume as well: a job on a preemptible machine passes
    --resume from its first start, and with nothing to resume the run starts from the beginning
    (each kind of trainer checkpoint: TRL's for farm-dpo, accelerate's state for farm-rm-train)."""
    from farmkit.lm.models import load_causal_lm

    sft, rm = models
    prefs = write_jsonl(tmp_path / "prefs.jsonl", preference_records())
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(8))
    output = tmp_path / "out"
    if tool == "farm-grpo":
        args = [str(sft), str(rm), str(prompts), "--steps", "1", "--rollout-batch-size", "8"]
        args += ["-n", "2", "--minibatch-size", "8", "--max-new-tokens", "3", "--save-steps", "0"]
    else:
        args = [str(sft), str(prefs), "--max-steps", "2", "--batch-size", "2", "--resume"]
    result = run_tool(tool, *args, "-o", str(output), "--device", "cpu")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    meta = json.loads((output / "meta.json").read_text())
    assert meta["config"]["device"] == "cpu"
    if tool != "farm-grpo":
        assert (
            f"no complete checkpoint in {output}-checkpoints: starting from the beginning"
            in result.stderr.decode()
        )
    if tool != "farm-rm-train":
        load_causal_lm(output, device="cpu")


def interrupt_at(monkeypatch, step: int, key: str = "step") -> None:
    """Make a trainer die right after logging step `step` (as a kill would: the step was done, its
    state not saved), by its tracking.log call."""
    from farmkit.train import tracking

    original = tracking.log

    def log(accelerator, row, number):
        original(accelerator, row, number)
        if number == step:
            raise KeyboardInterrupt(f"interrupted after {key} {step}")

    monkeypatch.setattr(tracking, "log", log)


def weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def assert_same_weights(first, second) -> None:
    a, b = weights(first), weights(second)
    assert a.keys() == b.keys()
    different = [key for key in a if not torch.equal(a[key], b[key])]
    assert not different, different[:5]


def metrics_without_time(folder) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "elapsed_s"} for row in rows]


def test_rm_train_resumed_after_an_interruption_ends_with_the_unbroken_runs_weights(
    tiny_model_path, tmp_path, monkeypatch
):
    from test_reward import keyword_prefs

    from farmkit.core.io import FarmError
    from farmkit.core.records import comparisons
    from farmkit.methods import reward as reward_module
    from farmkit.methods.reward import RewardConfig, train_reward_model

    items, _ = comparisons(keyword_prefs(40, seed=1))
    # 32 training pairs, 8 a step: 4 steps an epoch, 12 in all; states at 3, 6 and 9
    settings = dict(learning_rate=1e-3, batch_size=8, epochs=3, eval_fraction=0.2, save_steps=3)
    unbroken = train_reward_model(
        str(tiny_model_path), items, tmp_path / "unbroken", RewardConfig(**settings)
    )
    assert unbroken["steps"] == 12
    assert not (tmp_path / "unbroken-checkpoints").exists()  # removed when the run ended

    broken = tmp_path / "broken"
    with monkeypatch.context() as patch:
        interrupt_at(patch, 7)  # mid-epoch 2, one step past a state
        with pytest.raises(KeyboardInterrupt):
            train_reward_model(str(tiny_model_path), items, broken, RewardConfig(**settings))
    assert not broken.exists()
    assert sorted(p.name for p in (tmp_path / "broken-checkpoints").iterdir()) == ["step-000006"]
    # other settings than the interrupted run's are refused
    with pytest.raises(FarmError, match=r"other settings \(learning_rate\)"):
        train_reward_model(
            str(tiny_model_path),
            items,
            broken,
            RewardConfig(**{**settings, "learning_rate": 2e-3, "resume": True}),
        )
    # resumed, it trains steps 7 to 12 only, and ends where the unbroken run ended
    trained = []
    original = reward_module.tracking.log
    with monkeypatch.context() as patch:
        patch.setattr(
            reward_module.tracking,
            "log",
            lambda accelerator, row, step: (trained.append(step), original(accelerator, row, step)),
        )
        train_reward_model(
            str(tiny_model_path), items, broken, RewardConfig(**settings, resume=True)
        )
    assert trained == list(range(7, 13))
    assert_same_weights(tmp_path / "unbroken", broken)
    assert metrics_without_time(broken) == metrics_without_time(tmp_path / "unbroken")
    assert not (tmp_path / "broken-checkpoints").exists()


def test_dpo_resumed_after_an_interruption_ends_with_the_unbroken_runs_weights(
    models, tmp_path, monkeypatch
):
    from transformers import TrainerCallback

    from farmkit.methods.dpo import DPOConfig, dpo_pairs, train_dpo
    from farmkit.train import tracking

    sft, _ = models
    pairs, _ = dpo_pairs(preference_records(), "prefs")
    # 8 pairs, 2 a step: 4 steps an epoch, 8 in all; checkpoints at 3 and 6 (a step's cost is its
    # pairs' log-probabilities over the whole vocabulary: two pairs a step halve the test's time)
    pairs = pairs[:8]
    settings = dict(epochs=2, batch_size=2, learning_rate=1e-4, save_steps=3)
    train_dpo(str(sft), pairs, str(tmp_path / "unbroken"), DPOConfig(**settings))
    assert not (tmp_path / "unbroken-checkpoints").exists()

    trained, interrupted = [], []

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            trained.append(state.global_step)
            if state.global_step == 5 and not interrupted:  # its checkpoint would come at 6
                interrupted.append(5)
                raise KeyboardInterrupt("interrupted after step 5")

    original = tracking.trainer_reporting

    def reporting(*args, **kwargs):
        report_to, callbacks = original(*args, **kwargs)
        return report_to, [*callbacks, Interrupt()]

    monkeypatch.setattr(tracking, "trainer_reporting", reporting)
    with pytest.raises(KeyboardInterrupt):
        train_dpo(str(sft), pairs, str(tmp_path / "broken"), DPOConfig(**settings))
    checkpoints = tmp_path / "broken-checkpoints"
    assert sorted(path.name for path in checkpoints.glob("checkpoint-*")) == ["checkpoint-3"]
    trained.clear()
    train_dpo(str(sft), pairs, str(tmp_path / "broken"), DPOConfig(**settings, resume=True))
    assert trained == [4, 5, 6, 7, 8]  # resumed: the steps after the checkpoint, no others
    assert_same_weights(tmp_path / "unbroken", tmp_path / "broken")
    losses = [row["loss"] for row in metrics_without_time(tmp_path / "unbroken")]
    assert [row["loss"] for row in metrics_without_time(tmp_path / "broken")] == losses
    assert not checkpoints.exists()
    # the command line's --resume with nothing to resume: test_device_cpu_trains_and_writes_a_loadable_folder


QUARK = dict(
    prompts_per_round=8,
    samples_per_prompt=2,
    num_quantiles=2,
    learning_rate=3e-3,
    max_new_tokens=3,
    batch_size=8,
    epochs_per_round=1,
)


def test_quark_resumed_after_an_interruption_ends_with_the_unbroken_runs_weights(
    models, tmp_path, monkeypatch
):
    """With a gold judge watching every round: the resumed run keeps its count of evaluations."""
    from farmkit.methods.quark import QuarkConfig, train_quark
    from farmkit.train import tracking

    sft, rm = models
    prompts = prompt_records(16)
    settings = dict(rounds=4, save_steps=2, gold=str(rm), gold_size=4, **QUARK)
    unbroken = train_quark(
        str(sft), str(rm), prompts, str(tmp_path / "unbroken"), QuarkConfig(**settings)
    )
    assert not (tmp_path / "unbroken-checkpoints").exists()

    broken = tmp_path / "broken"
    with monkeypatch.context() as patch:
        interrupt_at(patch, 3, "round")
        with pytest.raises(KeyboardInterrupt):
            train_quark(str(sft), str(rm), prompts, str(broken), QuarkConfig(**settings))
    assert sorted(p.name for p in (tmp_path / "broken-checkpoints").iterdir()) == ["step-000002"]
    rounds = []
    original = tracking.log
    with monkeypatch.context() as patch:
        patch.setattr(
            tracking,
            "log",
            lambda accelerator, row, step: (rounds.append(step), original(accelerator, row, step)),
        )
        resumed = train_quark(
            str(sft), str(rm), prompts, str(broken), QuarkConfig(**settings, resume=True)
        )
    assert rounds == [3, 4]  # the rounds after the state, no others
    assert_same_weights(tmp_path / "unbroken", broken)
    timeless = [{k: v for k, v in row.items() if k != "elapsed_s"} for row in unbroken]
    assert [{k: v for k, v in row.items() if k != "elapsed_s"} for row in resumed] == timeless
    assert metrics_without_time(broken) == metrics_without_time(tmp_path / "unbroken")
    meta = json.loads((broken / "meta.json").read_text())
    assert meta["budget"]["tokens_sampled"] == unbroken[-1]["tokens_sampled"]
    whole = json.loads((tmp_path / "unbroken" / "meta.json").read_text())["gold"]
    assert meta["gold"]["evaluations"] == whole["evaluations"] == 4  # one a round
    assert meta["gold"]["tokens_sampled"] == whole["tokens_sampled"]
    assert not (tmp_path / "broken-checkpoints").exists()


def low_rank_changes(trained, base, rank: int) -> dict[str, int]:
    """The rank of (trained - base) of every weight that changed, where the trained folder's
    weights are `base` plus merged LoRA adapters of `rank`; norms and the old tokens' embedding rows
    are compared whole (LoRA leaves them alone). Returns {name: rank of the change} of the changed
    weights, asserting that no weight changed beyond what the adapters allow."""
    a, b = weights(trained), weights(base)
    changed = {}
    for name, before in b.items():
        after = a[name][: before.shape[0]] if name.endswith("embed_tokens.weight") else a[name]
        if torch.equal(after, before):
            continue
        assert after.dim() == 2 and "embed" not in name and "norm" not in name, name
        changed[name] = int(torch.linalg.matrix_rank((after - before).double(), atol=1e-6))
        assert changed[name] <= rank, (name, changed[name])
    return changed


def test_quark_lora_trains_adapters_and_the_control_token_and_saves_a_merged_policy(
    models, tmp_path, monkeypatch
):
    from policy_fixtures import spy_adamw

    from farmkit.lm.models import load_causal_lm
    from farmkit.methods.quark import QuarkConfig, quantile_token, train_quark

    sft, rm = models
    before = weights(sft)
    optimizers = spy_adamw(monkeypatch)
    config = QuarkConfig(rounds=2, lora=True, lora_rank=4, lora_alpha=8, **QUARK)
    train_quark(str(sft), str(rm), prompt_records(16), str(tmp_path / "lora"), config)
    (optimizer,) = optimizers
    trained = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    everything = sum(tensor.numel() for tensor in before.values())
    assert 0 < trained < everything / 10  # the adapters (and the control tokens' rows) alone
    assert all(torch.equal(before[key], weights(sft)[key]) for key in before)  # SFT untouched
    changed = low_rank_changes(tmp_path / "lora", sft, rank=4)
    assert len(changed) >= 8 and max(changed.values()) == 4  # every projection, rank 4
    model, tokenizer = load_causal_lm(tmp_path / "lora", device="cpu")  # merged, plain, loadable
    embedding = model.get_input_embeddings().weight
    top = tokenizer.convert_tokens_to_ids(quantile_token(0))
    bottom = tokenizer.convert_tokens_to_ids(quantile_token(1))
    assert not torch.equal(embedding[top], embedding[bottom])  # the token trained on moved
    assert not list((tmp_path / "lora").glob("adapter_*"))


def test_expiter_lora_rank_and_alpha_reach_the_adapters(tiny_model_path, models, tmp_path):
    _, rm = models
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(6))
    args = ["-n", "2", "--rounds", "1", "--max-new-tokens", "4", "--max-steps", "2"]
    args += ["--learning-rate", "1e-2", "--batch-size", "6", "--lora", "--lora-rank", "2"]
    args += ["--lora-alpha", "4", "-q"]
    result = run_tool(
        "farm-expiter",
        str(tiny_model_path),
        str(rm),
        str(prompts),
        "-o",
        str(tmp_path / "policy"),
        *args,
    )
    assert result.returncode == 0, result.stderr.decode()
    changed = low_rank_changes(tmp_path / "policy", tiny_model_path, rank=2)
    assert changed and max(changed.values()) == 2


def test_online_dpo_refuses_the_trainer_checkpoints_of_dpo(tmp_path):
    from farmkit.methods.online_dpo import OnlineDPOConfig

    for values in ({"save_steps": 5}, {"resume": True}):
        with pytest.raises(ValueError, match="running the same command again resumes it"):
            OnlineDPOConfig(**values)
    (tmp_path / "odpo.yaml").write_text("resume: true\n")
    result = run_tool(
        "farm-online-dpo", "m", "p", "-o", "o", "--config", str(tmp_path / "odpo.yaml")
    )
    assert result.returncode == 2
    assert b"running the same command again resumes it" in result.stderr
