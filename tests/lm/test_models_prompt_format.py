"""One instruction, one prompt: the text (and tokens) farm-sft trains on is exactly what farm-sample
then feeds the trained model, and what a reward model reads before the response, for the chat and
Alpaca templates, with and without an input."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools.farm_sample import cli as sample_cli
from transformers import AutoTokenizer

from farmkit.lm import generation
from farmkit.lm.models import (
    ALPACA_PREAMBLE,
    ALPACA_WITH_INPUT,
    PromptFormat,
    format_prompt,
    response_end,
)
from farmkit.methods import sft
from farmkit.train.scoring import reward_format, reward_text

EXAMPLES = [
    {"instruction": "Name a large mammal.", "input": "", "output": "The blue whale."},
    {
        "instruction": "Summarise the sentence.",
        "input": "Cats sleep for most of the day, often in the sun.",
        "output": "Cats sleep a lot.",
    },
]


def spy_prompts(monkeypatch) -> list[str]:
    """The prompts sampling hands to generation.generate, as they are handed (it still generates)."""
    sampled: list[str] = []
    original_generate = generation.generate

    def spy_generate(model, tokenizer, prompts, config, **options):
        sampled.extend(prompts)
        return original_generate(model, tokenizer, prompts, config, **options)

    monkeypatch.setattr(generation, "generate", spy_generate)
    return sampled


@pytest.mark.parametrize("template", ["chat", "alpaca"])
def test_training_sampling_and_reward_prompts_are_identical(
    template, tiny_model_path, tmp_path, monkeypatch
):
    trained: dict[str, list] = {"texts": [], "rows": []}
    original_text, original_tokenize = sft.training_text, sft.tokenize_examples

    def spy_text(tokenizer, prompt_format, example):
        pair = original_text(tokenizer, prompt_format, example)
        trained["texts"].append(pair)
        return pair

    def spy_tokenize(tokenizer, prompt_format, examples, max_length):
        rows = original_tokenize(tokenizer, prompt_format, examples, max_length)
        trained["rows"].extend(rows)
        return rows

    monkeypatch.setattr(sft, "training_text", spy_text)
    monkeypatch.setattr(sft, "tokenize_examples", spy_tokenize)
    folder = tmp_path / f"sft-{template}"
    sft.train_sft(
        str(tiny_model_path),
        EXAMPLES,
        folder,
        sft.SFTConfig(max_steps=1, batch_size=2, template=template, warmup_ratio=0.0),
    )
    training_prompts = [prompt for prompt, _ in trained["texts"]]

    sampled = spy_prompts(monkeypatch)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(
        b"".join(
            orjson.dumps({"instruction": e["instruction"], "input": e["input"]}) + b"\n"
            for e in EXAMPLES
        )
    )
    # --template left at auto: the folder's meta.json says which template it was trained with
    result = CliRunner().invoke(
        sample_cli, [str(folder), str(prompts), "--max-new-tokens", "2", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert sampled == training_prompts

    tokenizer = AutoTokenizer.from_pretrained(folder)
    for example, prompt, row in zip(EXAMPLES, sampled, trained["rows"], strict=True):
        if template == "alpaca":
            assert prompt.endswith("### Response:\n") and ("### Input:\n" in prompt) == bool(
                example["input"]
            )
        else:
            assert prompt.endswith("<|im_start|>assistant\n") and "### Instruction" not in prompt
        # token level: the training sequence starts with the very ids generation is given
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert row["input_ids"][: len(prompt_ids)] == prompt_ids
        assert row["completion_mask"] == [0] * len(prompt_ids) + [1] * (
            len(row["input_ids"]) - len(prompt_ids)
        )
        assert (
            tokenizer.decode(row["input_ids"][len(prompt_ids) :])
            == example["output"] + tokenizer.eos_token
        )
        # a reward model scores the same prompt followed by the response and the end token
        scored = reward_text(
            tokenizer,
            reward_format(folder, tokenizer),
            example["instruction"],
            example["input"],
            example["output"],
        )
        assert scored == prompt + example["output"] + response_end(tokenizer)


def test_alpaca_template_text(embedded_path):
    with_input = format_prompt(None, "Sort the list.", "3, 1, 2", "alpaca")
    assert with_input == (
        ALPACA_PREAMBLE.format(with_input=ALPACA_WITH_INPUT)
        + "\n\n### Instruction:\nSort the list.\n\n### Input:\n3, 1, 2\n\n### Response:\n"
    )
    assert format_prompt(None, "Sort the list.", None, "alpaca") == (
        ALPACA_PREAMBLE.format(with_input="")
        + "\n\n### Instruction:\nSort the list.\n\n### Response:\n"
    )


def test_chat_template_puts_the_input_after_a_blank_line_and_control_last(embedded_path):
    tokenizer = AutoTokenizer.from_pretrained(embedded_path)
    prompt = PromptFormat("chat").prompt(tokenizer, "Sort the list.", "3, 1, 2", control="<c>")
    assert "<|im_start|>user\nSort the list.\n\n3, 1, 2<|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n<c>")
    assert PromptFormat("auto").resolved(tokenizer) == "chat"


@pytest.fixture(scope="module")
def bos_model_path(tiny_model_path, tmp_path_factory):
    """The tiny model with a tokenizer that adds a beginning-of-sequence token by default (as Llama's
    and Mistral's do), which farmkit never adds: generation tokenizes prompts without special tokens."""
    import shutil

    from tokenizers import processors

    folder = tmp_path_factory.mktemp("bos") / "model"
    shutil.copytree(tiny_model_path, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", 0)]
    )
    tokenizer.bos_token = "<|endoftext|>"
    tokenizer.save_pretrained(folder)
    reloaded = AutoTokenizer.from_pretrained(folder)
    assert (
        reloaded("x")["input_ids"][0] == 0
        and reloaded("x", add_special_tokens=False)["input_ids"][0] != 0
    )
    return folder


def test_dpo_trains_on_the_ids_sampling_feeds(bos_model_path, tmp_path, monkeypatch):
    """The ids DPO's trainer batches for prompt + chosen (and + rejected) are the ids farm-sample feeds
    the trained model for that prompt, followed by the answer and its end token."""
    from trl.trainer import dpo_trainer

    from farmkit.methods.dpo import DPOConfig, train_dpo

    seen: list[dict] = []
    collate = dpo_trainer.DataCollatorForPreference.torch_call

    def spy_collate(self, examples):
        seen.extend(
            {key: list(example[key]) for key in ("prompt_ids", "chosen_ids", "rejected_ids")}
            for example in examples
        )
        return collate(self, examples)

    monkeypatch.setattr(dpo_trainer.DataCollatorForPreference, "torch_call", spy_collate)
    pairs = [
        {
            "instruction": e["instruction"],
            "input": e["input"],
            "chosen": e["output"],
            "rejected": "No idea.",
        }
        for e in EXAMPLES
    ]
    folder = tmp_path / "dpo"
    train_dpo(
        str(bos_model_path),
        pairs,
        str(folder),
        DPOConfig(max_steps=1, batch_size=2, learning_rate=1e-4),
    )

    sampled = spy_prompts(monkeypatch)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(
        b"".join(
            orjson.dumps({"instruction": e["instruction"], "input": e["input"]}) + b"\n"
            for e in EXAMPLES
        )
    )
    result = CliRunner().invoke(
        sample_cli, [str(folder), str(prompts), "--max-new-tokens", "2", "-q"]
    )
    assert result.exit_code == 0, result.output

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(seen) == len(pairs)  # one step, one batch of both pairs
    by_prompt = {tuple(row["prompt_ids"]): row for row in seen}
    for pair, prompt in zip(pairs, sampled, strict=True):
        fed = tokenizer(prompt, add_special_tokens=False)[
            "input_ids"
        ]  # exactly as generation encodes it
        assert tuple(fed) in by_prompt, (fed[:3], [row["prompt_ids"][:3] for row in seen])
        row = by_prompt[tuple(fed)]
        assert (
            row["prompt_ids"] + row["chosen_ids"]
            == fed
            + tokenizer(pair["chosen"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        )
        assert (
            row["prompt_ids"] + row["rejected_ids"]
            == fed
            + tokenizer(pair["rejected"] + tokenizer.eos_token, add_special_tokens=False)[
                "input_ids"
            ]
        )
