"""--preset: each preset sets what its publication ran, read from a table written here from the
publication (AlpacaFarm's scripts and trainer code, Ahmadian et al. 2024, DeepSeekMath, Dr.GRPO),
not from farmkit's presets; options given on the command line or in --config override a preset;
meta.json's config records the preset and the resolved values. No model is loaded: the commands'
trainers are replaced by one that keeps the config it was handed."""

from __future__ import annotations

import importlib
import json

import pytest
from click.testing import CliRunner
from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft, write_jsonl

from farmkit.methods.group import GRPOConfig, RLOOConfig
from farmkit.methods.ppo import PPOConfig
from farmkit.methods.quark import QuarkConfig
from farmkit.train.config import build_config, config_dict

# tatsu-lab/alpaca_farm, examples/scripts/rlhf_ppo.sh at 7f53055 (line), or the code it runs
ALPACAFARM_PPO = {
    "kl_coef": 0.0067,  # line 5: kl_coef=${5:-0.0067}
    "micro_batch_size": 2,  # line 11: --step_per_device_batch_size 2
    "rollout_batch_size": 512,  # line 18
    "minibatch_size": 256,  # line 19: --step_batch_size 256
    "learning_rate": 1e-5,  # line 20
    "warmup_steps": 5,  # line 21
    "steps": 390,  # line 23: --total_epochs 10, x 20,000 unlabeled prompts / 512
    "checkpoint_every": 20,  # line 26: --save_steps 20
    "value_head": "zero",  # line 17 (--init_value_with_reward) + rl_models.Value: zeroed head
    "ppo_epochs": 2,  # ppo_utils.TrainingArguments.noptepochs
    "value_loss_coef": 0.1,  # vf_coef
    "clip_range": 0.2,  # cliprange
    "value_clip_range": 0.2,  # cliprange_value
    "gamma": 1.0,
    "lam": 1.0,
    "whiten_rewards": True,
    "adam_eps": 1e-5,  # adam_epsilon
    "temperature": 1.0,
    "max_new_tokens": 300,  # response_len
    "kl_estimator": "clamped",  # ppo_trainer._shape_reward: clamp(logprobs - ref_logprobs, min=0)
    "max_grad_norm": 1.0,  # transformers.TrainingArguments' default
    "unfinished": "truncate",  # truncate_tokens None: post_reward penalizes nothing
    "advantage_estimator": "gae",  # ppo_trainer: GAE with a value model
    "policy_loss": "token-mean",  # ppo_trainer: per-token ratios, averaged over tokens
}

# tatsu-lab/alpaca_farm, examples/scripts/rlhf_quark.sh at 12a7a93 (line), or the code it runs
ALPACAFARM_QUARK = {
    "kl_coef": 0.05,  # line 5: kl_coef=${5:-0.05}
    "prompts_per_round": 512,  # line 17: --rollout_batch_size 512 (one response each)
    "samples_per_prompt": 1,
    "batch_size": 256,  # line 18: --step_batch_size 256
    "learning_rate": 3e-6,  # line 19
    "warmup_steps": 5,  # line 20
    "rounds": 390,  # line 22: --total_epochs 10
    "num_quantiles": 4,  # quark_utils.TrainingArguments.num_reward_tokens (850863a)
    "steps_per_round": 1,  # num_gradient_steps_per_step
    "keep": "top",  # train_on_best_quantile
    "control_token": "none",  # DataPool.sort_and_get injects no token for the best quantile
    "lr_schedule": "linear",  # transformers' default lr_scheduler_type
    "adam_eps": 1e-5,
    "max_grad_norm": 1.0,
    "temperature": 1.0,
    "max_new_tokens": 300,
    "unfinished": "truncate",
}

# Ahmadian et al. 2024: REINFORCE with the leave-one-out baseline, one update per batch
# (the leave-one-out baseline, the whole response one action)
AHMADIAN_RLOO = {
    "ppo_epochs": 1,
    "minibatch_size": 64,
    "kl_in": "reward",
    "kl_estimator": "k1",
    "advantage_estimator": "rloo",
    "policy_loss": "sequence-ratio",
}
# DeepSeekMath (Shao et al. 2024), its RL setup: lr 1e-6, KL 0.04, 64 outputs per question, max
# length 1024, batch 1024, a single update after each exploration stage
DEEPSEEKMATH_GRPO = {
    "learning_rate": 1e-6,
    "kl_coef": 0.04,
    "kl_in": "loss",
    "kl_estimator": "k3",
    "samples_per_prompt": 64,
    "max_new_tokens": 1024,
    "rollout_batch_size": 1024,
    "minibatch_size": 1024,
    "ppo_epochs": 1,
    "dr_grpo": False,
    "advantage_estimator": "grpo",  # normalized by the group's std
    "policy_loss": "seq-mean-token-mean",  # each output's tokens averaged, then the outputs
}
# Dr.GRPO: no std division, each output's token terms summed and divided by a constant
DR_GRPO = {
    "dr_grpo": True,
    "kl_coef": 0.0,
    "advantage_estimator": "dr_grpo",
    "policy_loss": "seq-mean-token-sum-norm",
}

# DAPO (Yu et al. 2025), section 4.1 and its training details: clip-higher eps_low 0.2, eps_high
# 0.28; token-level loss; no KL; dynamic sampling; overlong reward shaping, expected length 16,384
# plus a 4,096-token punishment cache (max 20,480); 512 prompts x 16 responses; mini-batch 512
# (16 gradient updates per rollout step); lr 1e-6, linear warm-up over 20 rollout steps
DAPO = {
    "policy_loss": "dapo",
    "clip_range_low": 0.2,
    "clip_range_high": 0.28,
    "kl_coef": 0.0,
    "dynamic_sampling": True,
    "overlong": "penalty",
    "overlong_cache": 4096,
    "max_new_tokens": 20480,
    "samples_per_prompt": 16,
    "rollout_batch_size": 512 * 16,
    "minibatch_size": 512,
    "ppo_epochs": 1,
    "learning_rate": 1e-6,
    "warmup_steps": 20,
    "advantage_estimator": "grpo",
}
# GSPO as TRL's paper index reproduces it: importance_sampling_level="sequence", epsilon 3e-4,
# epsilon_high 4e-4, beta 0, steps_per_generation 4 x gradient_accumulation_steps (4 minibatches)
GSPO = {
    "policy_loss": "gspo",
    "clip_range_low": 3e-4,
    "clip_range_high": 4e-4,
    "kl_coef": 0.0,
    "ppo_epochs": 1,
    "minibatch_size": 64 // 4,
}

CASES = [
    (PPOConfig, "alpacafarm", ALPACAFARM_PPO),
    (QuarkConfig, "alpacafarm", ALPACAFARM_QUARK),
    (RLOOConfig, "ahmadian2024", AHMADIAN_RLOO),
    (GRPOConfig, "deepseekmath", DEEPSEEKMATH_GRPO),
    (GRPOConfig, "dr-grpo", DR_GRPO),
    (GRPOConfig, "dapo", DAPO),
    (GRPOConfig, "gspo", GSPO),
]


@pytest.mark.parametrize(("config_class", "preset", "table"), CASES)
def test_a_preset_sets_what_its_publication_ran(config_class, preset, table):
    resolved = config_dict(build_config(config_class, {"preset": preset}))
    differ = {key: (resolved[key], value) for key, value in table.items() if resolved[key] != value}
    assert differ == {}, f"--preset {preset}: (farmkit, published) {differ}"
    assert resolved["preset"] == preset


@pytest.mark.parametrize(("config_class", "preset", "table"), CASES)
def test_the_defaults_are_not_the_preset(config_class, preset, table):
    # the tables above must be able to fail: without the preset some published value is missing
    defaults = config_dict(build_config(config_class, {}))
    assert defaults["preset"] is None
    assert any(defaults[key] != value for key, value in table.items())


def test_one_update_follows_the_rollout_batch_given():
    for config_class, preset in ((RLOOConfig, "ahmadian2024"), (GRPOConfig, "deepseekmath")):
        config = build_config(config_class, {"preset": preset, "rollout_batch_size": 128})
        assert (config.rollout_batch_size, config.minibatch_size, config.ppo_epochs) == (
            128,
            128,
            1,
        )
        config = build_config(config_class, {"preset": preset, "minibatch_size": 16})
        assert config.minibatch_size == 16  # given: it wins


def test_an_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="unknown preset 'paper'; known: alpacafarm"):
        build_config(PPOConfig, {"preset": "paper"})


TOOLS = {
    "farm_ppo": ("farmkit.methods.ppo", "train_ppo"),
    "farm_quark": ("farmkit.methods.quark", "train_quark"),
    "farm_rloo": ("farmkit.methods.group", "train_group"),
    "farm_grpo": ("farmkit.methods.group", "train_group"),
}


def run_tool(tool, args, tmp_path, monkeypatch):
    """The config the command hands its trainer, and the command's result; nothing is trained."""
    module, function = TOOLS[tool]
    handed = []

    def keep(*_args, **kwargs):
        handed.append(_args[4])
        return [] if tool == "farm_quark" else {}

    monkeypatch.setattr(importlib.import_module(module), function, keep)
    # the placeholder folders are no reward model: the check would refuse them before the trainer
    monkeypatch.setattr("farmkit.lm.models.check_reward_model", lambda path: path)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(2))
    cli = importlib.import_module(f"farmkit.tools.{tool}").cli
    result = CliRunner().invoke(
        cli, ["sft/", "rm/", str(prompts), "-o", str(tmp_path / "out"), *args]
    )
    return (handed[0] if handed else None), result


def test_options_given_override_the_preset(tmp_path, monkeypatch):
    # --kl-estimator k1 is farmkit's default, given explicitly: it still wins over the preset
    config, result = run_tool(
        "farm_ppo",
        ["--preset", "alpacafarm", "--learning-rate", "2e-5", "--kl-estimator", "k1"],
        tmp_path,
        monkeypatch,
    )
    assert result.exit_code == 0, result.output
    resolved = config_dict(config)
    assert (resolved["learning_rate"], resolved["kl_estimator"]) == (2e-5, "k1")
    rest = {
        key: value
        for key, value in ALPACAFARM_PPO.items()
        if key not in ("learning_rate", "kl_estimator")
    }
    assert {key: resolved[key] for key in rest} == rest
    assert resolved["preset"] == "alpacafarm"


def test_a_config_file_may_name_the_preset_and_flags_still_win(tmp_path, monkeypatch):
    yaml_file = tmp_path / "quark.yaml"
    yaml_file.write_text("preset: alpacafarm\nnum-samples: 2\nrounds: 3\n")
    config, result = run_tool(
        "farm_quark", ["--config", str(yaml_file), "--rounds", "7"], tmp_path, monkeypatch
    )
    assert result.exit_code == 0, result.output
    assert (config.preset, config.samples_per_prompt, config.rounds) == ("alpacafarm", 2, 7)
    assert (config.learning_rate, config.num_quantiles, config.batch_size) == (3e-6, 4, 256)


@pytest.mark.parametrize(
    ("tool", "preset", "table"),
    [
        ("farm_rloo", "ahmadian2024", AHMADIAN_RLOO),
        ("farm_grpo", "deepseekmath", DEEPSEEKMATH_GRPO),
        ("farm_grpo", "dr-grpo", DR_GRPO),
        ("farm_grpo", "dapo", DAPO),
        ("farm_grpo", "gspo", GSPO),
    ],
)
def test_the_group_tools_take_their_presets(tool, preset, table, tmp_path, monkeypatch):
    config, result = run_tool(tool, ["--preset", preset], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert {key: getattr(config, key) for key in table} == table


def test_a_bad_preset_is_a_usage_error_before_anything_runs(tmp_path, monkeypatch):
    config, result = run_tool("farm_ppo", ["--preset", "paper"], tmp_path, monkeypatch)
    assert result.exit_code == 2 and config is None
    assert "'paper' is not 'alpacafarm'" in result.output
    yaml_file = tmp_path / "bad.yaml"
    yaml_file.write_text("preset: paper\n")
    config, result = run_tool("farm_grpo", ["--config", str(yaml_file)], tmp_path, monkeypatch)
    assert result.exit_code == 2 and config is None
    assert "'paper' is not one of 'deepseekmath', 'dr-grpo'" in result.output


def test_ppo_epochs_help_says_when_the_ratio_is_one():
    for config_class in (RLOOConfig, GRPOConfig):
        text = {field.name: field for field in config_class.__dataclass_fields__.values()}[
            "ppo_epochs"
        ].metadata["help"]
        assert "only with one pass of one minibatch" in text
        assert "minibatch-size = rollout-batch-size" in text


def test_size_full_runs_ppo_and_quark_with_the_alpacafarm_preset(tmp_path):
    """examples' SIZE=full is AlpacaFarm's run: farm-ppo and farm-quark get --preset alpacafarm and
    no hyperparameter that would override it; the CPU sizes keep their own rows."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def planned(size: str) -> dict[str, str]:
        result = subprocess.run(
            ["make", "-C", str(examples), "-n", "demo", f"SIZE={size}", f"OUT={tmp_path}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        text = result.stdout.replace("\\\n", " ")
        return {
            tool: line
            for line in text.splitlines()
            for tool in ("farm_ppo", "farm_quark", "farm-ppo ", "farm-quark ")
            if tool in line
        }

    full = planned("full")
    for tool in ("farm_ppo", "farm_quark"):
        line = full[tool]
        assert "--preset alpacafarm" in line, line
        flags = set(re.findall(r"(--[a-z-]+)", line.split(f"farmkit.tools.{tool}")[1]))
        assert flags <= {"--preset", "--steps", "--rounds", "--generation-batch-size", "--seed"}, (
            line
        )
    for line in planned("demo").values():
        assert "--preset" not in line and "--learning-rate 5e-5" in line, line


def test_a_tiny_rloo_run_with_its_preset_makes_one_unclipped_update_per_batch(
    tiny_model_path, tmp_path
):
    """Under --preset ahmadian2024 each batch is one update on the samples' own policy: the ratio
    is 1 (nothing clipped, approx_kl 0), and meta.json records the preset and what it resolved to."""
    from farmkit.tools.farm_rloo import cli

    sft = tiny_sft(tiny_model_path, tmp_path / "sft")
    rm = keyword_reward_model(tiny_model_path, tmp_path / "rm")
    prompts = write_jsonl(tmp_path / "prompts.jsonl", prompt_records(16))
    output = tmp_path / "rloo"
    args = [str(sft), str(rm), str(prompts), "-o", str(output), "--steps", "2"]
    args += ["--rollout-batch-size", "16", "--num-samples", "4", "--max-new-tokens", "4"]
    args += ["--learning-rate", "3e-3", "--preset", "ahmadian2024", "-q"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = (tmp_path / "rloo-checkpoints" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(row) for row in rows]
    assert [row["clip_fraction"] for row in rows] == [0.0, 0.0]
    assert [row["approx_kl"] for row in rows] == [0.0, 0.0]
    config = json.loads((output / "meta.json").read_text())["config"]
    assert config["preset"] == "ahmadian2024"
    assert (config["ppo_epochs"], config["minibatch_size"], config["learning_rate"]) == (
        1,
        16,
        3e-3,
    )


def test_a_run_resumes_under_the_preset_or_under_the_values_it_resolved_to(tmp_path):
    from farmkit.core.io import FarmError
    from farmkit.train.checkpoints import check_same_settings

    preset = build_config(PPOConfig, {"preset": "alpacafarm"})
    spelled_out = build_config(
        PPOConfig, {key: value for key, value in config_dict(preset).items() if key != "preset"}
    )
    check_same_settings(tmp_path, config_dict(spelled_out), preset)
    check_same_settings(tmp_path, config_dict(preset), spelled_out)
    with pytest.raises(FarmError, match="learning_rate"):  # a value that differs still refuses
        check_same_settings(
            tmp_path,
            config_dict(preset),
            build_config(PPOConfig, {"preset": "alpacafarm", "learning_rate": 2e-5}),
        )


def test_a_checkpoint_from_before_an_option_existed_resumes_when_the_option_keeps_its_default(
    tmp_path,
):
    """A run interrupted under an older farmkit resumes under this one: an option added since (not in
    the checkpoint's settings) at its default does not refuse; the option set otherwise does."""
    from farmkit.core.io import FarmError
    from farmkit.train.checkpoints import check_same_settings

    now = build_config(PPOConfig, {})
    older = {key: value for key, value in config_dict(now).items() if key != "precision"}
    check_same_settings(tmp_path, older, now)
    with pytest.raises(FarmError, match="precision"):
        check_same_settings(tmp_path, older, build_config(PPOConfig, {"precision": "bf16"}))
