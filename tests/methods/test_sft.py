"""farm-sft and farmkit.methods.sft: real training runs, small. The embedded model learns a handful
of demonstrations (loss on the response falls, weights move, the folder samples); the tiny model
covers the modes (Binary FeedME, reward conditioning, LoRA) and checkpoint/resume."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from conftest import run_tool
from farmkit.tools.farm_sample import cli as sample_cli
from farmkit.tools.farm_sft import cli as sft_cli

from farmkit.lm.modelio import META_KEYS
from farmkit.methods import sft
from farmkit.methods.sft import NEGATIVE_TOKEN, POSITIVE_TOKEN, SFTConfig, train_sft

DEMOS = [
    {"instruction": "Name the colour of a clear daytime sky.", "input": "", "output": "Blue."},
    {"instruction": "Translate the word into French.", "input": "cat", "output": "Chat."},
    {"instruction": "What is three plus four?", "input": "", "output": "Seven."},
    {"instruction": "Give the opposite of the word.", "input": "hot", "output": "Cold."},
]

PREFERENCES = [
    {
        "instruction": "Say something kind.",
        "input": "",
        "output_1": "You did well today.",
        "output_2": "Go away.",
        "preference": 1,
    },
    {
        "instruction": "Name a fruit.",
        "input": "",
        "output_1": "A chair.",
        "output_2": "An apple.",
        "preference": 2,
    },
    {
        "instruction": "Count to three.",
        "input": "",
        "output_1": "1 2 3",
        "output_2": "one two three",
        "preference": 1.5,
    },
    {
        "instruction": "Name a planet.",
        "input": "",
        "output_1": "Mars.",
        "output_2": "Paris.",
        "preference": None,
    },
]


def invoke(command, *args: str):
    """Run a farm-* command in this process (no second import of torch and TRL), quietly."""
    result = CliRunner().invoke(command, [*args, "-q"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def state(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def quick(**overrides) -> SFTConfig:
    settings = {
        "max_steps": 4,
        "batch_size": 4,
        "learning_rate": 1e-3,
        "warmup_ratio": 0.0,
        "logging_steps": 1,
        "lr_scheduler": "constant",
        "max_length": 128,
    }
    settings.update(overrides)
    return SFTConfig(**settings)


def test_sft_lowers_the_response_loss_and_changes_the_weights(tiny_model_path, tmp_path):
    from farmkit.lm.models import PromptFormat, load_causal_lm

    before_model, tokenizer = load_causal_lm(tiny_model_path)
    loss_before = sft.completion_loss(
        before_model, tokenizer, PromptFormat.for_model(tiny_model_path), DEMOS
    )
    summary = train_sft(str(tiny_model_path), DEMOS, tmp_path / "sft", quick(max_steps=8))
    assert summary["steps"] == 8 and len(summary["losses"]) == 8
    after_model, _ = load_causal_lm(tmp_path / "sft")
    loss_after = sft.completion_loss(
        after_model, tokenizer, PromptFormat.for_model(tmp_path / "sft"), DEMOS
    )
    assert loss_after < loss_before - 1.0, (loss_before, loss_after)
    before = before_model.state_dict()
    assert all(
        not (tensor == before[name]).all()
        for name, tensor in after_model.state_dict().items()
        if "norm" not in name
    )


def test_prompt_tokens_carry_no_loss_in_the_trainer(tiny_model_path, tmp_path, monkeypatch):
    """What TRL's trainer trains on: in every batch its collator hands the model, the label of each
    prompt token (and of padding) is -100, and each response token's label is the token itself."""
    from trl.trainer import sft_trainer

    from farmkit.lm.models import PromptFormat, load_tokenizer

    original, batches, packed = sft_trainer.DataCollatorForLanguageModeling.torch_call, [], []

    def torch_call(self, examples):
        batch = original(self, examples)
        batches.append({key: batch[key].clone() for key in ("input_ids", "labels")})
        packed.append("position_ids" in batch and "attention_mask" not in batch)
        if packed[-1]:  # a padding-free batch: one row, positions restart at each
            starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
            ends = [*starts[1:], batch["input_ids"].shape[1]]
            batches[-1] = {
                key: [batches[-1][key][0, a:b] for a, b in zip(starts, ends, strict=True)]
                for key in ("input_ids", "labels")
            }
        return batch

    monkeypatch.setattr(sft_trainer.DataCollatorForLanguageModeling, "torch_call", torch_call)
    from policy_fixtures import spy_adamw

    optimizers = spy_adamw(monkeypatch)
    train_sft(str(tiny_model_path), DEMOS, tmp_path / "sft", quick(max_steps=2))
    assert [o.defaults["fused"] for o in optimizers] == [True]  # torch's fused AdamW, the default
    assert batches and not any(packed)  # padded batches, the default (FARMKIT_PACKED_SFT=1 packs)
    tokenizer = load_tokenizer(tiny_model_path)
    fmt = PromptFormat.for_model(tiny_model_path)
    expected = {}  # the tokens of each demonstration -> its response's positions
    for demo in DEMOS:
        prompt_ids, completion_ids = sft.training_ids(tokenizer, fmt, demo)
        expected[tuple(prompt_ids + completion_ids)] = len(prompt_ids)
    seen = 0
    for batch in batches:
        for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True):
            ids, labels = ids.tolist(), labels.tolist()
            key = next(k for k in expected if ids[: len(k)] == list(k))
            start = expected[key]
            assert labels[:start] == [-100] * start
            assert labels[start : len(key)] == list(key[start:])
            assert set(labels[len(key) :]) <= {-100}
            seen += 1
    assert seen >= 4


@pytest.mark.slow
def test_embedded_sft_lowers_the_loss_changes_weights_and_samples(embedded_path, tmp_path):
    from farmkit.lm.generation import DecodingConfig, generate
    from farmkit.lm.models import PromptFormat, load_causal_lm

    before_model, tokenizer = load_causal_lm(embedded_path)
    prompt_format = PromptFormat.for_model(embedded_path)
    loss_before = sft.completion_loss(before_model, tokenizer, prompt_format, DEMOS)
    before = {name: tensor.clone() for name, tensor in before_model.state_dict().items()}
    del before_model

    out = tmp_path / "sft"
    summary = train_sft(
        "embedded",
        DEMOS,
        out,
        quick(max_steps=6, learning_rate=5e-5),
        meta_extra={"inputs": {"demos": "x"}},
    )
    assert summary["steps"] == 6

    after_model, after_tokenizer = load_causal_lm(out)
    loss_after = sft.completion_loss(
        after_model, after_tokenizer, PromptFormat.for_model(out), DEMOS
    )
    assert loss_after < loss_before * 0.8, (loss_before, loss_after)
    changed = [
        name
        for name, tensor in after_model.state_dict().items()
        if not (tensor == before[name]).all()
    ]
    assert len(changed) > len(before) // 2

    meta = json.loads((out / "meta.json").read_text())
    assert (
        meta["tool"] == "farm-sft" and meta["kind"] == "policy" and meta["base_model"] == "embedded"
    )
    assert (
        meta["prompt_template"] == "chat" and meta["seed"] == 0 and meta["inputs"] == {"demos": "x"}
    )
    assert meta["config"]["max_steps"] == 6 and "transformers" in meta["versions"]
    assert set(META_KEYS) <= set(meta)  # the one layout every model folder has
    assert not Path(f"{out}-checkpoints").exists()

    # the folder loads as farm-sample loads it, and greedy decoding now gives the taught answer
    prompt = PromptFormat.for_model(out).prompt(after_tokenizer, DEMOS[2]["instruction"])
    [[sample]] = generate(
        after_model, after_tokenizer, [prompt], DecodingConfig(temperature=0, max_new_tokens=6)
    )
    assert "Seven" in sample.text


def test_farm_sft_cli_writes_a_folder_that_farm_sample_reads(tiny_model_path, tmp_path):
    demos = write_jsonl(tmp_path / "demos.jsonl", DEMOS)
    out = tmp_path / "model"
    invoke(
        sft_cli,
        str(tiny_model_path),
        str(demos),
        "-o",
        str(out),
        "--max-steps",
        "2",
        "--batch-size",
        "2",
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["mode"] == "demonstrations" and list(meta["inputs"]) == [str(demos)]
    # the setup that really ran: one plain process (no launcher, no DeepSpeed)
    assert meta["launch"] == {
        "distributed_type": "NO",
        "num_processes": 1,
        "zero_stage": 0,
        "mixed_precision": "no",
    }
    assert meta["base_model"] == str(tiny_model_path.resolve())
    assert len(meta["inputs"][str(demos)]) == 64
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"instruction": "Say hi.", "input": ""}])
    sampled = invoke(sample_cli, str(out), str(prompts), "-n", "1", "--max-new-tokens", "4")
    [record] = [json.loads(line) for line in sampled.stdout.splitlines()]
    assert record["generator"] == "model" and record["instruction"] == "Say hi."


def test_a_demonstration_without_output_is_an_error_naming_its_line(tiny_model_path, tmp_path):
    demos = write_jsonl(tmp_path / "demos.jsonl", [DEMOS[0], {"instruction": "No answer here."}])
    result = run_tool("farm-sft", str(tiny_model_path), str(demos), "-o", str(tmp_path / "out"))
    assert result.returncode == 1
    assert f"{demos}:2: the demonstration has no output" in result.stderr.decode()
    assert not (tmp_path / "out").exists()


def test_modes_are_exclusive(tmp_path):
    result = CliRunner().invoke(
        sft_cli,
        [
            "embedded",
            "x.jsonl",
            "-o",
            str(tmp_path / "o"),
            "--from-preferences",
            "--reward-conditioning",
        ],
    )
    assert result.exit_code == 2 and "pick one" in result.output


def test_the_control_tokens_must_differ(tmp_path):
    arguments = ["embedded", "x.jsonl", "-o", str(tmp_path / "o"), "--reward-conditioning"]
    result = CliRunner().invoke(sft_cli, [*arguments, "--negative-token", POSITIVE_TOKEN])
    assert result.exit_code == 2, result.output
    assert "Error: --positive-token and --negative-token must differ" in result.output
    assert not (tmp_path / "o").exists()


def test_feedme_and_conditioning_examples_follow_the_verdicts():
    from farmkit.core.records import comparisons

    items, counts = comparisons(PREFERENCES)
    assert counts == {"used": 2, "tie": 1, "null": 1}
    assert sft.feedme_examples(items) == [
        {"instruction": "Say something kind.", "input": "", "output": "You did well today."},
        {"instruction": "Name a fruit.", "input": "", "output": "An apple."},
    ]
    conditioned = sft.conditioning_examples(items)
    assert [(e["output"], e["control"]) for e in conditioned] == [
        ("You did well today.", POSITIVE_TOKEN),
        ("Go away.", NEGATIVE_TOKEN),
        ("An apple.", POSITIVE_TOKEN),
        ("A chair.", NEGATIVE_TOKEN),
    ]


def test_from_preferences_trains_on_the_preferred_outputs(tiny_model_path, tmp_path, monkeypatch):
    seen = []
    original = sft.tokenize_examples

    def spy(tokenizer, prompt_format, examples, max_length):
        seen.extend(examples)
        return original(tokenizer, prompt_format, examples, max_length)

    monkeypatch.setattr(sft, "tokenize_examples", spy)
    prefs = write_jsonl(tmp_path / "prefs.jsonl", PREFERENCES)
    invoke(
        sft_cli,
        str(tiny_model_path),
        str(prefs),
        "-o",
        str(tmp_path / "feedme"),
        "--from-preferences",
        "--max-steps",
        "1",
    )
    assert [e["output"] for e in seen] == ["You did well today.", "An apple."]
    assert json.loads((tmp_path / "feedme" / "meta.json").read_text())["mode"] == "binary-feedme"


def test_reward_conditioning_adds_control_tokens_and_records_the_positive_one(
    tiny_model_path, tmp_path
):
    from transformers import AutoTokenizer

    prefs = write_jsonl(tmp_path / "prefs.jsonl", PREFERENCES)
    out = tmp_path / "conditioned"
    invoke(
        sft_cli,
        str(tiny_model_path),
        str(prefs),
        "-o",
        str(out),
        "--reward-conditioning",
        "--max-steps",
        "2",
        "--learning-rate",
        "1e-2",
    )
    meta = json.loads((out / "meta.json").read_text())
    assert (
        meta["sampling_control_token"] == POSITIVE_TOKEN and meta["mode"] == "reward-conditioning"
    )
    tokenizer = AutoTokenizer.from_pretrained(out)
    base_size = len(AutoTokenizer.from_pretrained(tiny_model_path))
    assert len(tokenizer) == base_size + 2
    for token in (POSITIVE_TOKEN, NEGATIVE_TOKEN):
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [
            tokenizer.convert_tokens_to_ids(token)
        ]
    weights = state(out)
    embeddings = weights["model.embed_tokens.weight"]
    assert embeddings.shape[0] == base_size + 2
    # the two new rows were trained apart (they start from the same distribution)
    assert not (embeddings[-1] == embeddings[-2]).all()


def test_lora_is_merged_into_a_plain_folder(tiny_model_path, tmp_path):
    out = tmp_path / "lora"
    conditioned = [{**DEMOS[0], "control": POSITIVE_TOKEN}, {**DEMOS[1], "control": NEGATIVE_TOKEN}]
    summary = train_sft(
        str(tiny_model_path),
        DEMOS + conditioned,
        out,
        quick(lora=True, lora_rank=4, max_steps=2, learning_rate=1e-2),
    )
    assert summary["steps"] == 2
    assert (
        state(out)["model.embed_tokens.weight"].shape[0]
        == state(tiny_model_path)["model.embed_tokens.weight"].shape[0] + 2
    )
    names = set(state(out))
    assert not any("lora" in name for name in names)
    assert not (out / "adapter_config.json").exists()
    base, tuned = state(tiny_model_path), state(out)
    assert any(
        not (base[name] == tuned[name]).all() for name in base if "layers" in name
    )  # the merged adapters


def test_checkpoints_resume_to_the_same_weights(tiny_model_path, tmp_path):
    """The checkpoint resumed from is step 2 of 4 demonstrations in batches of 2: exactly the end of
    the first epoch, the case where a resumed run can believe itself finished."""
    assert len(DEMOS) == 2 * 2
    straight = tmp_path / "straight"
    train_sft(str(tiny_model_path), DEMOS, straight, quick(max_steps=4, batch_size=2))

    interrupted = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        _train_until(tiny_model_path, interrupted, stop_after=2)
    checkpoints = Path(f"{interrupted}-checkpoints")
    assert (checkpoints / "checkpoint-2").is_dir() and not interrupted.exists()
    summary = train_sft(
        str(tiny_model_path),
        DEMOS,
        interrupted,
        quick(max_steps=4, batch_size=2, save_steps=2, resume=True),
    )
    assert summary["steps"] == 4
    assert not checkpoints.exists()  # removed once the folder is complete
    a, b = state(straight), state(interrupted)
    assert all((a[name] - b[name]).abs().max() < 1e-5 for name in a)


def _train_until(model: Path, output: Path, stop_after: int) -> None:
    """Run train_sft and interrupt it (as a user's Ctrl-C would) once step `stop_after` is saved."""
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step >= stop_after:
                raise KeyboardInterrupt

    import trl

    original = trl.SFTTrainer.__init__

    def with_callback(self, *args, **kwargs):
        kwargs["callbacks"] = [Interrupt()]
        original(self, *args, **kwargs)

    trl.SFTTrainer.__init__ = with_callback
    try:
        train_sft(str(model), DEMOS, output, quick(max_steps=4, batch_size=2, save_steps=2))
    finally:
        trl.SFTTrainer.__init__ = original


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="warmup-ratio"):
        SFTConfig(warmup_ratio=1.5)
    with pytest.raises(ValueError, match="--epochs: 0 is not a whole number >= 1"):
        SFTConfig(epochs=0)


def test_options_carry_the_config_help_and_read_a_yaml_file(tmp_path, monkeypatch):
    from dataclasses import fields

    # wide enough that no help text wraps (a wrap may break a hyphenated word such as DIR-checkpoints)
    help_text = " ".join(
        CliRunner()
        .invoke(sft_cli, ["--help"], terminal_width=10_000, max_content_width=10_000)
        .output.split()
    )
    for item in fields(SFTConfig):
        assert " ".join(item.metadata["help"].split()) in help_text, item.name
    config = tmp_path / "sft.yaml"
    config.write_text("learning-rate: 0.5\nmax_steps: 7\n")
    seen = {}

    def capture(model, examples, output_dir, config, meta_extra=None):
        seen["config"] = config
        return {"steps": 0, "train_loss": 0.0}

    demos = write_jsonl(tmp_path / "demos.jsonl", DEMOS)
    monkeypatch.setattr(sft, "train_sft", capture)
    invoke(
        sft_cli,
        "embedded",
        str(demos),
        "-o",
        str(tmp_path / "o"),
        "--config",
        str(config),
        "--max-steps",
        "3",
    )
    assert (seen["config"].learning_rate, seen["config"].max_steps) == (
        0.5,
        3,
    )  # the flag wins over the file


@pytest.mark.slow  # a trainer run; tests/methods/test_dpo.py checks the same switch in the default lane
def test_fused_adamw_switched_off_gives_the_trainer_the_per_tensor_loop(
    tiny_model_path, tmp_path, monkeypatch
):
    """farm-sft's Trainer steps torch's fused AdamW by default (bench/bench_optim.py; checked in
    test_prompt_tokens_carry_no_loss_in_the_trainer, which trains anyway); FARMKIT_FUSED_ADAMW=0
    reaches it too (tests/train/test_policy.py: the same update)."""
    from policy_fixtures import spy_adamw

    created = spy_adamw(monkeypatch)
    monkeypatch.setenv("FARMKIT_FUSED_ADAMW", "0")
    train_sft(str(tiny_model_path), DEMOS, tmp_path / "loop", quick(max_steps=1))
    assert [bool(o.defaults["fused"]) for o in created] == [False]


def test_packed_logits_equal_the_padded_batchs(tiny_model_path):
    """A padding-free batch (TRL's collator, as farm-sft builds it) gives each demonstration the
    logits the padded batch gives it: attention stays within each one. Without the boundaries
    (positions running on) the demonstrations after the first would read the ones before them."""
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from farmkit.lm.models import PromptFormat, load_causal_lm

    model, tokenizer = load_causal_lm(tiny_model_path)
    rows = sft.tokenize_examples(tokenizer, PromptFormat.for_model(tiny_model_path), DEMOS, 128)
    lengths = [len(row["input_ids"]) for row in rows]
    assert len(set(lengths)) > 1  # the padded batch has padding
    padded = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id)(rows)
    packed = DataCollatorForLanguageModeling(
        pad_token_id=tokenizer.pad_token_id, padding_free=True
    )(rows)
    model.eval()
    with torch.no_grad():
        wide = model(
            input_ids=padded["input_ids"], attention_mask=padded["attention_mask"], use_cache=False
        ).logits
        flat = model(
            input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False
        ).logits[0]
        run_on = model(input_ids=packed["input_ids"], use_cache=False).logits[0]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    for row, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        torch.testing.assert_close(
            flat[start : start + length], wide[row, :length], rtol=1e-4, atol=1e-4
        )
    last = starts[-1]
    assert (run_on[last : last + lengths[-1]] - wide[-1, : lengths[-1]]).abs().max() > 1e-2


@pytest.mark.slow  # two trainer runs; the default lane checks the pieces
def test_packed_and_padded_batches_train_alike(tiny_model_path, tmp_path, monkeypatch):
    """farm-sft's padding-free batches (FARMKIT_PACKED_SFT=1) and padded ones (the default) give the
    same losses and weights to float rounding."""
    from trl.trainer import sft_trainer

    original, rows = sft_trainer.DataCollatorForLanguageModeling.torch_call, []

    def torch_call(self, examples):
        batch = original(self, examples)
        rows.append(batch["input_ids"].shape[0])
        return batch

    monkeypatch.setattr(sft_trainer.DataCollatorForLanguageModeling, "torch_call", torch_call)
    losses, weights = {}, {}
    for packed in ("1", "0"):
        monkeypatch.setenv("FARMKIT_PACKED_SFT", packed)
        summary = train_sft(str(tiny_model_path), DEMOS, tmp_path / packed, quick(max_steps=2))
        losses[packed], weights[packed] = summary["losses"], state(tmp_path / packed)
        assert set(rows) == ({1} if packed == "1" else {4}), rows  # one row, or the batch's 4
        rows.clear()
    assert losses["1"] == pytest.approx(losses["0"], rel=1e-4)
    import torch

    for name, tensor in weights["0"].items():
        torch.testing.assert_close(weights["1"][name], tensor, rtol=1e-4, atol=1e-5)
