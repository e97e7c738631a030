"""bench/bench_rl.py (farm-grpo / farm-rloo against TRL's trainers): the settings reach both tools as
the same values, and one warm-up and one timed step of each tool, run in this process on the tiny
model under the benchmark's probes, give the summary and the figures it reports."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_rl", ROOT / "bench" / "bench_rl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while it is built
    spec.loader.exec_module(module)
    return module


bench = load_bench()
TINY = bench.Settings(
    prompts_per_step=2, samples=2, max_new_tokens=4, warmup=1, steps=1, micro_batch=2
)


@pytest.mark.heavy
@pytest.mark.parametrize("method", ["grpo", "rloo"])
def test_settings_reach_both_tools_alike(method, tmp_path, monkeypatch):
    import trl

    settings = bench.Settings(minibatch=8, micro_batch=4, epochs=2)  # 16 responses a step
    args = bench.farmkit_args(method, settings, "sft", "rm", "prompts.jsonl", str(tmp_path / "o"))
    tool = __import__(f"farmkit.tools.farm_{method}", fromlist=["main"])
    seen = []
    # the on-policy commands' one body (cli.policy_command) hands the config to train_on_prompts
    monkeypatch.setattr(
        "farmkit.cli.train_on_prompts", lambda train, config, *rest: seen.append(config)
    )
    with pytest.raises(SystemExit) as exit:
        tool.main(args)  # the console script's own option parsing
    assert exit.value.code == 0
    (ours,) = seen
    theirs = (trl.GRPOConfig if method == "grpo" else trl.RLOOConfig)(
        **bench.trl_config(method, settings, str(tmp_path / "trl"))
    )
    assert ours.rollout_batch_size == theirs.generation_batch_size == 16
    assert ours.samples_per_prompt == theirs.num_generations == 4
    assert ours.micro_batch_size == theirs.per_device_train_batch_size == 4
    assert ours.minibatch_size == 4 * theirs.gradient_accumulation_steps == 8
    assert ours.ppo_epochs == theirs.num_iterations == 2
    # TRL counts optimizer steps: 2 minibatches x 2 epochs for each of farmkit's steps
    assert theirs.max_steps == ours.steps * 4 == (settings.warmup + settings.steps) * 4
    assert ours.max_new_tokens == theirs.max_completion_length == 32
    assert ours.temperature == theirs.temperature == 1.0 and theirs.top_k == 0
    assert ours.kl_coef == theirs.beta == (0.04 if method == "grpo" else 0.05)
    assert ours.clip_range == theirs.epsilon == 0.2
    assert ours.learning_rate == theirs.learning_rate
    assert ours.adam_eps == theirs.adam_epsilon and ours.max_grad_norm == theirs.max_grad_norm
    assert ours.checkpoint_every == 0 and theirs.save_strategy == "no"
    assert not theirs.bf16 and not theirs.gradient_checkpointing and theirs.use_cpu
    if method == "grpo":
        assert (ours.kl_in, ours.kl_estimator, ours.dr_grpo) == ("loss", "k3", False)
        assert (theirs.loss_type, theirs.scale_rewards) == ("grpo", "group")
        assert not theirs.use_bias_correction_kl
    else:
        assert (ours.kl_in, ours.kl_estimator) == ("reward", "k1")
        assert not theirs.normalize_advantages


def test_summary_times_the_steps_after_the_warm_up():
    settings = bench.Settings(prompts_per_step=2, samples=2, warmup=1, steps=2)
    rollouts = [
        {
            "tokens": tokens,
            "rows": 4,
            "prompt_tokens": 40,
            "phases": {"generate": 1.0},
            "cpu": {"generate": 0.5},
        }
        for tokens in (100, 60, 40)
    ]
    result = {
        "tool": "t",
        "method": "grpo",
        "step_ends_s": [5.0, 7.0, 10.0],
        "step_ends_cpu_s": [4.0, 5.0, 7.0],
        "rollouts": rollouts,
    }
    summary = bench.summarize(result, settings)
    assert summary["step_seconds"] == [2.0, 3.0] and summary["cpu_step_seconds"] == [1.0, 2.0]
    assert summary["seconds_per_step"] == 2.5 and summary["cpu_seconds_per_step"] == 1.5
    assert summary["tokens_per_second"] == 100 / 5 and summary["tokens_per_cpu_second"] == 100 / 3
    assert summary["phases_per_step"]["generate"] == 1.0
    assert summary["phases_per_step"]["other"] == pytest.approx(1.5)
    assert summary["cpu_phases_per_step"]["other"] == pytest.approx(1.0)
    other = bench.summarize(
        {**result, "step_ends_s": [1, 2, 3], "step_ends_cpu_s": [1, 2, 3]}, settings
    )
    both = bench.pooled([summary, other])
    assert both["step_seconds"] == [2.0, 3.0, 1, 1]
    assert both["tokens_per_second"] == 200 / 7
    assert both["phases_per_step"]["other"] == pytest.approx(7 / 4 - 1.0)
    rows = bench.figure_rows("grpo", summary, both, "label")
    assert [row["unit"] for row in rows] == ["s/step", "tokens/s", "CPU s/step"]
    assert rows[0]["ratio"] == round(2.5 / 1.75, 3) and rows[0]["met"] is False
    assert rows[1]["ratio"] == round(20 / (200 / 7), 3) and rows[1]["met"] is False


def test_completion_tokens_count_up_to_the_first_end_token():
    import torch

    completion = torch.tensor([[5, 6, 2, 2], [5, 6, 7, 8], [2, 2, 2, 2]])
    assert bench.completion_tokens(completion, eos_id=2) == 3 + 4 + 1


@pytest.mark.heavy
def test_one_step_of_each_tool_on_the_tiny_model(tmp_path, tiny_model_path, monkeypatch):
    """Both workers in this process (the probes patched through monkeypatch, undone after each)."""
    reward_model = bench.build_reward_model(str(tiny_model_path), tmp_path / "rm", seed=0)
    records = bench.prompt_records(TINY.prompts_per_step * TINY.total_steps)
    bench.check_prompts(str(tiny_model_path), records)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(record) + "\n" for record in records))
    summaries, prompt_tokens = {}, {}
    for method in ("grpo", "rloo"):
        for tool, worker in bench.WORKERS.items():
            paths = {
                "policy": str(tiny_model_path),
                "reward_model": str(reward_model),
                "prompts": str(prompts),
                "output": str(tmp_path / f"{tool}-{method}"),
            }
            result = worker(method, TINY, paths, patch=monkeypatch.setattr)
            monkeypatch.undo()
            assert len(result["step_ends_s"]) == len(result["rollouts"]) == TINY.total_steps
            assert len(result["step_ends_cpu_s"]) == TINY.total_steps
            if tool == "farmkit":  # its own log and the probe saw the step end at one moment
                own, probe = result["step_ends_s"], result["probe_step_ends_s"]
                assert own[-1] - own[0] == pytest.approx(probe[-1] - probe[0], abs=0.05)
            for rollout in result["rollouts"]:
                assert rollout["rows"] == TINY.rollout
                assert 0 < rollout["tokens"] <= TINY.rollout * TINY.max_new_tokens
                assert {"generate", "reward", "reference_logprobs", "backward"} <= set(
                    rollout["phases"]
                )
            # the probe counts what the tool itself logs
            assert result["own_log_tokens"] == [r["tokens"] for r in result["rollouts"]]
            summaries[tool, method] = bench.summarize(result, TINY)
            prompt_tokens[tool] = sum(r["prompt_tokens"] for r in result["rollouts"])
        # the same prompts (token for token, each once, in each tool's own order) on both sides
        assert prompt_tokens["farmkit"] == prompt_tokens["trl"]
    rows = bench.figure_rows("grpo", summaries["farmkit", "grpo"], summaries["trl", "grpo"], "tiny")
    assert [row["unit"] for row in rows] == ["s/step", "tokens/s", "CPU s/step"]
    assert all(row["value"] > 0 and row["peer_value"] > 0 for row in rows)
