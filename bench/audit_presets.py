"""Audit of issue 25's "settings and departures" with cases of its own (not the tests'): can a method
be run as published in one step, what does that run resolve to, what do the README and --help say,
and how does farm-online-dpo sample, label and train across rounds. Run it on a checkout before and
after a change (it adapts to code without --preset) and compare the figures it prints as JSON.

    python bench/audit_presets.py [--models]      # --models: also the tiny-model runs (minutes)

Not part of the test suite.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

# AlpacaFarm's values, from tatsu-lab/alpaca_farm examples/scripts/rlhf_ppo.sh (7f53055) and
# rlhf_quark.sh (12a7a93) and the TrainingArguments / trainers they run
PPO_PUBLISHED = {
    "rollout_batch_size": 512,
    "minibatch_size": 256,
    "learning_rate": 1e-5,
    "warmup_steps": 5,
    "kl_coef": 0.0067,
    "ppo_epochs": 2,
    "whiten_rewards": True,
    "kl_estimator": "clamped",
    "value_head": "zero",
    "adam_eps": 1e-5,
    "value_loss_coef": 0.1,
    "max_new_tokens": 300,
}
QUARK_PUBLISHED = {
    "prompts_per_round": 512,
    "samples_per_prompt": 1,
    "batch_size": 256,
    "steps_per_round": 1,
    "learning_rate": 3e-6,
    "warmup_steps": 5,
    "kl_coef": 0.05,
    "num_quantiles": 4,
    "keep": "top",
}


def handed_config(tool: str, args: list[str]) -> tuple[object | None, str]:
    """The config `tool` hands its trainer for `args` (nothing trained), and its output."""
    targets = {
        "farm_ppo": ("farmkit.methods.ppo", "train_ppo"),
        "farm_quark": ("farmkit.methods.quark", "train_quark"),
        "farm_rloo": ("farmkit.methods.group", "train_group"),
        "farm_grpo": ("farmkit.methods.group", "train_group"),
    }
    module = importlib.import_module(targets[tool][0])
    original = getattr(module, targets[tool][1])
    handed: list = []
    setattr(
        module,
        targets[tool][1],
        lambda *a, **k: handed.append(a[4]) or ([] if "quark" in tool else {}),
    )
    try:
        with tempfile.TemporaryDirectory() as folder:
            prompts = Path(folder) / "p.jsonl"
            prompts.write_text('{"instruction": "Say a colour."}\n' * 3)
            cli = importlib.import_module(f"farmkit.tools.{tool}").cli
            result = CliRunner().invoke(cli, ["s/", "r/", str(prompts), "-o", f"{folder}/o", *args])
    finally:
        setattr(module, targets[tool][1], original)
    return (handed[0] if handed else None), result.output


def differing(config: object, published: dict) -> list[str]:
    return [key for key, value in published.items() if getattr(config, key) != value]


def audit_settings() -> dict:
    figures: dict = {}
    for tool, published, given in (
        ("farm_ppo", PPO_PUBLISHED, {"steps": 50, "kl_coef": 0.02}),
        ("farm_quark", QUARK_PUBLISHED, {"rounds": 12, "max_new_tokens": 200}),
    ):
        fresh = [
            item
            for key, value in given.items()
            for item in (f"--{key.replace('_', '-')}", str(value))
        ]
        config, output = handed_config(tool, ["--preset", "alpacafarm", *fresh])
        name = tool.removeprefix("farm_")
        if config is None:
            default, _ = handed_config(tool, fresh)
            figures[name] = {
                "preset": "missing: " + output.strip().splitlines()[-1],
                "one-step run differs from AlpacaFarm in": [
                    key for key in differing(default, published) if key not in given
                ],
            }
        else:
            figures[name] = {
                "preset": config.preset,
                "one-step run differs from AlpacaFarm in": [
                    key for key in differing(config, published) if key not in given
                ],
                "given options kept": all(
                    getattr(config, key) == value for key, value in given.items()
                ),
            }
    # one update per batch as published: updates = ppo_epochs x rollout / minibatch
    for tool, preset, fresh in (
        ("farm_rloo", "ahmadian2024", ["--rollout-batch-size", "48", "--num-samples", "4"]),
        ("farm_grpo", "deepseekmath", ["--rollout-batch-size", "96", "--num-samples", "8"]),
    ):
        config, _ = handed_config(tool, ["--preset", preset, *fresh])
        if config is None:
            config, _ = handed_config(tool, fresh)
            label = "defaults (no preset)"
        else:
            label = f"--preset {preset}"
        figures[tool.removeprefix("farm_") + " updates per batch"] = {
            label: config.ppo_epochs * config.rollout_batch_size // config.minibatch_size
        }
    config, _ = handed_config("farm_grpo", ["--preset", "dr-grpo"])
    if config is None:
        config, _ = handed_config("farm_grpo", ["--dr-grpo"])
        figures["dr-grpo kl coef"] = {"--dr-grpo (no preset)": config.kl_coef}
    else:
        figures["dr-grpo kl coef"] = {"--preset dr-grpo": config.kl_coef}
    # what the tool pages (once the README's sections) and --help say
    ppo_table = (ROOT / "docs" / "tools" / "farm-ppo.md").read_text()
    quark_table = (ROOT / "docs" / "tools" / "farm-quark.md").read_text()
    lr_row = re.search(r"\| `--learning-rate` \| 1e-5 \| ([^|]+)\|", ppo_table)
    figures["README PPO learning rate (AlpacaFarm column)"] = lr_row.group(1).strip()
    figures["README Quark table has a learning-rate row"] = (
        "| `--learning-rate` | 1e-5 | 3e-6" in quark_table
    )
    quantiles = re.search(r"\| `--num-quantiles` \| 5 \| ([^|]+)\|", quark_table)
    figures["README num-quantiles AlpacaFarm"] = quantiles.group(1).strip()
    from farmkit.methods.group import GRPOConfig, RLOOConfig
    from farmkit.methods.quark import QuarkConfig

    figures["--num-quantiles help"] = QuarkConfig.__dataclass_fields__["num_quantiles"].metadata[
        "help"
    ]
    help_text = RLOOConfig.__dataclass_fields__["ppo_epochs"].metadata["help"]
    figures["--ppo-epochs help claims ratio 1 unconditionally"] = (
        "(1: plain on-policy policy gradient, the ratio is 1)" in help_text
    )
    figures["--ppo-epochs help names the minibatch condition"] = (
        "minibatch-size = rollout-batch-size" in help_text
    )
    assert GRPOConfig.__dataclass_fields__["ppo_epochs"].metadata["help"] == help_text
    return figures


def audit_models(work: Path) -> dict:
    """Tiny-model runs: the RLOO update's ratio, and online DPO across rounds."""
    import torch
    from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft, write_jsonl
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from farmkit.lm.models import resolve

    embedded = Path(resolve("embedded"))
    tiny = work / "tiny"
    tokenizer = AutoTokenizer.from_pretrained(embedded)
    torch.manual_seed(1)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
        )
    ).save_pretrained(tiny)
    tokenizer.save_pretrained(tiny)
    sft = tiny_sft(tiny, work / "sft")
    rm = keyword_reward_model(tiny, work / "rm")
    prompts = write_jsonl(work / "prompts.jsonl", prompt_records(24))
    figures: dict = {}

    # RLOO: does the update clip or move the ratio? (2 steps, rollout batch 32, k 4)
    from farmkit.tools.farm_rloo import cli as rloo

    base = [
        str(sft),
        str(rm),
        str(prompts),
        "--steps",
        "2",
        "--rollout-batch-size",
        "32",
        "--num-samples",
        "4",
        "--max-new-tokens",
        "4",
        "--learning-rate",
        "3e-3",
        "-q",
    ]
    for label, extra in (("defaults", []), ("--preset ahmadian2024", ["--preset", "ahmadian2024"])):
        out = work / f"rloo-{len(extra)}"
        result = CliRunner().invoke(rloo, [*base, "-o", str(out), *extra])
        if result.exit_code != 0:
            figures[f"rloo {label}"] = "refused: " + result.output.strip().splitlines()[-1]
            continue
        rows = [
            json.loads(line)
            for line in (work / f"{out.name}-checkpoints" / "metrics.jsonl")
            .read_text()
            .splitlines()
        ]
        figures[f"rloo {label}"] = {
            "clip_fraction": [round(row["clip_fraction"], 4) for row in rows],
            "approx_kl": [round(row["approx_kl"], 6) for row in rows],
        }

    # online DPO: 3 rounds of 8 prompts, 2 steps each
    from farmkit.tools.farm_online_dpo import cli as online

    out = work / "odpo"
    result = CliRunner().invoke(
        online,
        [
            str(sft),
            str(prompts),
            "-o",
            str(out),
            "--rounds",
            "3",
            "--prompts-per-round",
            "8",
            "--max-new-tokens",
            "3",
            "--learning-rate",
            "5e-4",
            "--batch-size",
            "4",
            "--max-steps",
            "2",
            "--no-cache",
            "-q",
        ],
        env={"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None},
    )
    assert result.exit_code == 0, result.output
    rates = []
    for number in (1, 2, 3):
        path = work / "odpo-checkpoints" / f"round_{number}" / "policy" / "metrics.jsonl"
        rates.append([json.loads(line)["learning_rate"] for line in path.read_text().splitlines()])
    figures["online-dpo learning rates by round"] = rates
    figures["online-dpo rounds starting below the previous round's last rate"] = sum(
        rates[i][0] < rates[i - 1][-1] for i in (1, 2)
    )
    records = [
        json.loads(line)
        for line in (work / "odpo-checkpoints" / "round_1" / "preferences.jsonl")
        .read_text()
        .splitlines()
    ]
    figures["online-dpo preference records saying whether each answer was cut"] = (
        sum("finished_1" in record and "finished_2" in record for record in records),
        len(records),
    )

    # a cut answer: is it trained with an end token?
    from farmkit.lm.models import PromptFormat, load_tokenizer
    from farmkit.methods import dpo
    from farmkit.methods.sft import training_ids

    tok = load_tokenizer(sft)
    fmt = PromptFormat("chat")
    prefs = [
        {
            "instruction": "Name a fruit.",
            "output_1": "an apple and a pe",
            "output_2": "pear",
            "preference": 2,
            "finished_1": False,
            "finished_2": True,
        },
        {
            "instruction": "Name a tree.",
            "output_1": "oak",
            "output_2": "the tall spruce of t",
            "preference": 2,
            "finished_1": True,
            "finished_2": False,
        },
    ]
    pairs, _ = dpo.dpo_pairs(prefs, "audit")
    if hasattr(dpo, "pair_rows"):
        rows = dpo.pair_rows(tok, fmt, pairs, 512)
    else:  # what train_dpo did: every answer followed by its end token
        rows = [
            {
                "chosen_ids": training_ids(tok, fmt, {**p, "output": p["chosen"]})[1],
                "rejected_ids": training_ids(tok, fmt, {**p, "output": p["rejected"]})[1],
            }
            for p in pairs
        ]
    cut = [rows[0]["rejected_ids"], rows[1]["chosen_ids"]]
    figures["cut answers trained with an end token"] = (
        sum(tok.eos_token_id in ids for ids in cut),
        len(cut),
    )

    # pairs sampled with a generation_config's extras vs without
    import shutil

    from farmkit.methods.online_dpo import OnlineDPOConfig, _sample_pairs

    shaped = work / "shaped"
    shutil.copytree(sft, shaped)
    (shaped / "generation_config.json").write_text(
        json.dumps({"min_new_tokens": 3, "top_p": 0.3, "repetition_penalty": 3.0})
    )
    config = OnlineDPOConfig(max_new_tokens=5, generation_batch_size=24, rollout_backend="hf")
    plain, _ = _sample_pairs(str(sft), str(sft), prompt_records(12), config, 11, "g")
    extras, _ = _sample_pairs(str(shaped), str(sft), prompt_records(12), config, 11, "g")
    same = sum(
        a["output_1"] == b["output_1"] and a["output_2"] == b["output_2"]
        for a, b in zip(plain, extras, strict=True)
    )
    figures["pairs unchanged by the model's generation_config"] = (same, len(plain))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", action="store_true", help="also the tiny-model runs")
    args = parser.parse_args()
    figures = {"settings": audit_settings()}
    if args.models:
        with tempfile.TemporaryDirectory(prefix="audit-presets-") as work:
            figures["runs"] = audit_models(Path(work))
    print(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
