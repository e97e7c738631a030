"""Other projects' formats read as farmkit records (TRL, hh-rlhf, chat messages, AlpacaFarm outputs,
Parquet), and farm-convert's round trip to TRL's formats."""

from __future__ import annotations

import orjson
import pytest

from farmkit.core.formats import split_transcript
from farmkit.core.io import FarmError, read_records
from farmkit.lm.models import format_prompt


def write(path, rows):
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


USER = {"role": "user", "content": "Name a colour."}
FOLLOW = {"role": "user", "content": "Another one?"}


def reply(text):
    return [{"role": "assistant", "content": text}]


def test_trl_standard_explicit_prompt_preferences(tmp_path):
    path = write(
        tmp_path / "p.jsonl",
        [{"prompt": "Name a colour.", "chosen": "Blue.", "rejected": "Seven."}],
    )
    [record] = read_records(path, "preference")
    assert (
        record["instruction"],
        record["output_1"],
        record["output_2"],
        record["preference"],
    ) == ("Name a colour.", "Blue.", "Seven.", 1.0)
    assert "messages" not in record


def test_trl_conversational_explicit_and_implicit_prompts(tmp_path):
    turns = [USER, *reply("Blue."), FOLLOW]
    explicit = write(
        tmp_path / "e.jsonl", [{"prompt": turns, "chosen": reply("Red."), "rejected": reply("No.")}]
    )
    implicit = write(
        tmp_path / "i.jsonl",
        [{"chosen": [*turns, *reply("Red.")], "rejected": [*turns, *reply("No.")]}],
    )
    for path in (explicit, implicit):
        [record] = read_records(path, "preference")
        assert record["instruction"] == "Another one?"
        assert record["messages"] == turns
        assert (record["output_1"], record["output_2"]) == ("Red.", "No.")


def test_trl_standard_implicit_prompt_is_the_shared_beginning(tmp_path):
    path = write(
        tmp_path / "p.jsonl", [{"chosen": "Q: colour? A: blue", "rejected": "Q: colour? A: 7"}]
    )
    [record] = read_records(path, "preference")
    assert (record["instruction"], record["output_1"], record["output_2"]) == (
        "Q: colour? A: ",
        "blue",
        "7",
    )


def test_hh_rlhf_pairs_split_at_the_last_assistant_turn(tmp_path):
    context = "\n\nHuman: How do I boil an egg?\n\nAssistant: In water.\n\nHuman: For how long?"
    path = write(
        tmp_path / "hh.jsonl",
        [
            {
                "chosen": context + "\n\nAssistant: About nine minutes.",
                "rejected": context + "\n\nAssistant: Forever.",
            }
        ],
    )
    [record] = read_records(path, "preference")
    assert record["instruction"] == "For how long?"
    assert record["messages"] == [
        {"role": "user", "content": "How do I boil an egg?"},
        {"role": "assistant", "content": "In water."},
        {"role": "user", "content": "For how long?"},
    ]
    assert (record["output_1"], record["output_2"]) == ("About nine minutes.", "Forever.")


def test_hh_rlhf_pairs_with_different_contexts_are_refused_with_the_line(tmp_path):
    good = {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: a\n\nAssistant: c"}
    bad = {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: OTHER\n\nAssistant: c"}
    path = write(tmp_path / "hh.jsonl", [good, bad])
    with pytest.raises(
        FarmError, match=r"hh\.jsonl:2: chosen and rejected continue different conversations"
    ):
        list(read_records(path, "preference"))


def test_a_later_record_in_another_format_names_its_line(tmp_path):
    path = write(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "a", "chosen": "b", "rejected": "c"},
            {"prompt": "a", "chosen": "b", "rejected": "c"},
            {"instruction": "a", "output_1": "b", "output_2": "c", "preference": 1},
        ],
    )
    with pytest.raises(
        FarmError, match=r"mixed\.jsonl:3: missing field 'chosen' .*TRL preference rows"
    ):
        list(read_records(path, "preference"))


def test_trl_prompt_completion_and_messages_as_demonstrations(tmp_path):
    path = write(tmp_path / "pc.jsonl", [{"prompt": "Say hi.", "completion": "Hi!"}])
    [record] = read_records(path, "instruction")
    assert (record["instruction"], record["output"]) == ("Say hi.", "Hi!")
    chat = write(
        tmp_path / "m.jsonl",
        [
            {"messages": [USER, *reply("Blue.")]},
            {"messages": [{"role": "system", "content": "Be brief."}, USER, *reply("Red.")]},
        ],
    )
    first, second = read_records(chat, "instruction")
    assert (first["instruction"], first["output"], "messages" in first) == (
        "Name a colour.",
        "Blue.",
        False,
    )
    assert second["messages"][0] == {"role": "system", "content": "Be brief."}
    assert second["output"] == "Red."


def test_alpacafarm_outputs_without_generator_take_the_file_name(tmp_path):
    path = tmp_path / "outputs_sft.json"
    path.write_bytes(orjson.dumps([{"instruction": "a", "input": "", "output": "b"}]))
    [record] = read_records(path, "output")
    assert record["generator"] == "outputs_sft"


def test_farmkit_records_are_untouched(tmp_path):
    row = {
        "instruction": "a",
        "input": "",
        "output_1": "b",
        "output_2": "c",
        "preference": 2,
        "extra": {"x": 1},
    }
    path = write(tmp_path / "p.jsonl", [row])
    assert list(read_records(path, "preference")) == [row]


def test_parquet_is_read(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    path = tmp_path / "p.parquet"
    parquet.write_table(
        pyarrow.Table.from_pylist([{"prompt": "a", "chosen": "b", "rejected": "c"}] * 3), str(path)
    )
    records = list(read_records(path, "preference"))
    assert len(records) == 3 and records[0]["output_1"] == "b"


def test_hf_datasets_folder_is_read(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.Dataset.from_list([{"prompt": "a", "completion": "b"}]).save_to_disk(str(folder))
    [record] = read_records(folder, "instruction")
    assert (record["instruction"], record["output"]) == ("a", "b")


def test_split_transcript_refuses_text_outside_turns():
    with pytest.raises(ValueError, match="outside the Human/Assistant turns"):
        split_transcript("preamble\n\nHuman: a\n\nAssistant: b", "chosen")


class ChatTokenizer:
    chat_template = "x"
    eos_token = "<end>"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_multi_turn_prompts_render_the_whole_conversation():
    turns = [USER, *reply("Blue."), FOLLOW]
    chat = format_prompt(ChatTokenizer(), "Another one?", "", "chat", messages=turns)
    assert chat == "<user>Name a colour.<assistant>Blue.<user>Another one?<assistant>"
    alpaca = format_prompt(None, "Another one?", "", "alpaca", messages=turns)
    assert "### Instruction:\nAnother one?" in alpaca
    assert "### Input:\nUser: Name a colour.\n\nAssistant: Blue." in alpaca


@pytest.mark.parametrize("target", ["trl", "trl-chat"])
def test_farm_convert_round_trip_keeps_choices_and_soft_labels(tmp_path, target, run_farm):
    prefs = [
        {
            "instruction": f"task {i}",
            "input": "",
            "output_1": f"one {i}",
            "output_2": f"two {i}",
            "preference": p,
        }
        for i, p in enumerate([1, 2, 1.25, 1.8, 1.5, None])
    ]
    source = write(tmp_path / "prefs.jsonl", prefs)
    out = tmp_path / "trl.parquet"
    result = run_farm("farm-convert", str(source), "--to", target, "-o", str(out))
    assert result.returncode == 0, result.stderr.decode()
    assert b"left out 2 tie(s) or null verdict(s)" in result.stderr
    back = run_farm("farm-convert", str(out))
    assert back.returncode == 0, back.stderr.decode()
    rows = [orjson.loads(line) for line in back.stdout.splitlines()]
    assert len(rows) == 4
    for original, row in zip(prefs[:4], rows, strict=True):
        assert row == {**original, "preference": pytest.approx(original["preference"])}


def test_farm_convert_refuses_multi_turn_as_plain_text(tmp_path, run_farm):
    source = write(
        tmp_path / "p.jsonl",
        [
            {
                "instruction": "b",
                "output_1": "x",
                "output_2": "y",
                "preference": 1,
                "messages": [USER, *reply("Blue."), {"role": "user", "content": "b"}],
            }
        ],
    )
    result = run_farm("farm-convert", str(source), "--to", "trl")
    assert result.returncode == 1
    assert (
        f"{source}:1: a multi-turn prompt cannot be written as plain text" in result.stderr.decode()
    )


def test_training_tools_take_trl_and_chat_files_directly(tmp_path, tiny_model_path, run_farm):
    prefs = write(
        tmp_path / "trl.jsonl",
        [{"prompt": f"Colour {i}?", "chosen": "blue", "rejected": "seven"} for i in range(8)],
    )
    rm = run_farm(
        "farm-rm-train",
        str(tiny_model_path),
        str(prefs),
        "-o",
        str(tmp_path / "rm"),
        "--epochs",
        "1",
        "--batch-size",
        "4",
    )
    assert rm.returncode == 0, rm.stderr.decode()
    assert b"as TRL preference rows" in rm.stderr
    assert (tmp_path / "rm" / "meta.json").exists()
    chats = write(tmp_path / "chat.jsonl", [{"messages": [USER, *reply("Blue.")]}] * 4)
    sft = run_farm(
        "farm-sft",
        str(tiny_model_path),
        str(chats),
        "-o",
        str(tmp_path / "sft"),
        "--max-steps",
        "1",
        "--batch-size",
        "2",
    )
    assert sft.returncode == 0, sft.stderr.decode()
    assert (tmp_path / "sft" / "meta.json").exists()


def test_sft_trains_on_the_whole_conversation(tiny_model_path):
    from farmkit.lm.models import PromptFormat, load_tokenizer
    from farmkit.methods.sft import training_text

    tokenizer = load_tokenizer(tiny_model_path)
    turns = [USER, *reply("Blue."), FOLLOW]
    prompt, completion = training_text(
        tokenizer,
        PromptFormat("chat"),
        {"instruction": "Another one?", "input": "", "output": "Red.", "messages": turns},
    )
    assert prompt.index("Name a colour.") < prompt.index("Blue.") < prompt.index("Another one?")
    assert prompt == PromptFormat("chat").record_prompt(
        tokenizer, {"instruction": "Another one?", "messages": turns}
    )
    assert completion.startswith("Red.")


def test_preferences_keep_the_conversation_for_reward_models_and_dpo(tmp_path):
    from farmkit.core.records import chosen_rejected, comparisons
    from farmkit.lm.models import PromptFormat
    from farmkit.train.scoring import reward_text

    context = "\n\nHuman: How do I boil an egg?\n\nAssistant: In water.\n\nHuman: For how long?"
    path = write(
        tmp_path / "hh.jsonl",
        [
            {
                "chosen": context + "\n\nAssistant: Nine minutes.",
                "rejected": context + "\n\nAssistant: Forever.",
            }
        ],
    )
    [item], _ = comparisons(read_records(path, "preference"))
    assert [m["content"] for m in item.messages] == [
        "How do I boil an egg?",
        "In water.",
        "For how long?",
    ]
    [pair] = chosen_rejected([item])
    assert pair["messages"] == item.messages
    text = reward_text(
        ChatTokenizer(),
        PromptFormat("chat"),
        item.instruction,
        item.input,
        item.output_1,
        messages=item.messages,
    )
    assert (
        text
        == "<user>How do I boil an egg?<assistant>In water.<user>For how long?<assistant>Nine minutes.<end>"
    )


def convert(*args):
    """farm-convert in-process: (exit code, stdout records, stderr)."""
    from click.testing import CliRunner
    from farmkit.tools.farm_convert import cli

    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    rows = [orjson.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return result.exit_code, rows, result.stderr


OUTPUTS = [
    {
        "instruction": "Name a colour.",
        "input": "",
        "output": "Blue.",
        "generator": "sft",
        "sample_index": 0,
        "id": 3,
    },
    {
        "instruction": "Translate into French.",
        "input": "Good morning",
        "output": "Bonjour",
        "generator": "sft",
        "sample_index": 1,
        "id": 4,
    },
]


@pytest.mark.parametrize("target", ["trl", "trl-chat"])
@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_output_records_round_trip_through_trl_prompt_completion(tmp_path, target, suffix):
    """Outputs go out as prompt/completion with generator, id, sample_index and input in columns of
    their own, and come back as the same records (read as outputs, by guess or by --kind)."""
    if suffix == "parquet":
        pytest.importorskip("pyarrow")
    source = write(tmp_path / "outputs.jsonl", OUTPUTS)
    out = tmp_path / f"trl.{suffix}"
    code, _, stderr = convert(source, "--to", target, "-o", out)
    assert code == 0, stderr
    assert "2 output record(s)" in stderr
    first, second = read_records(out)
    assert first["generator"] == "sft" and first["sample_index"] == 0 and first["id"] == 3
    assert "completion" in first and "output" not in first and "instruction" not in first
    # the prompt joins the instruction and its input, which stays beside it to split them again
    prompt = second["prompt"] if target == "trl" else second["prompt"][-1]["content"]
    assert (prompt, second["input"]) == ("Translate into French.\n\nGood morning", "Good morning")
    for kind in ([], ["--kind", "output"]):
        code, back, stderr = convert(out, *kind)
        assert code == 0, stderr
        assert back == OUTPUTS


@pytest.mark.parametrize("target", ["trl", "trl-chat"])
@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_instruction_records_round_trip_through_trl(tmp_path, target, suffix):
    if suffix == "parquet":
        pytest.importorskip("pyarrow")
    demonstrations = [
        {k: v for k, v in r.items() if k not in ("generator", "sample_index")} for r in OUTPUTS
    ]
    prompts = [{k: v for k, v in r.items() if k != "output"} for r in demonstrations]
    for name, records in (("demos", demonstrations), ("prompts", prompts)):
        source = write(tmp_path / f"{name}.jsonl", records)
        out = tmp_path / f"{name}.{suffix}"
        code, _, stderr = convert(source, "--to", target, "-o", out)
        assert code == 0, stderr
        assert "instruction record(s)" in stderr
        code, back, stderr = convert(out)
        assert code == 0, stderr
        assert back == records, name


def test_multi_turn_instructions_round_trip_as_chat_rows(tmp_path):
    record = {
        "instruction": "Another one?",
        "input": "",
        "output": "Red.",
        "messages": [USER, *reply("Blue."), FOLLOW],
        "id": 9,
    }
    source = write(tmp_path / "chat.jsonl", [record])
    code, _, stderr = convert(source, "--to", "trl-chat", "-o", tmp_path / "chat.trl.jsonl")
    assert code == 0, stderr
    code, back, stderr = convert(tmp_path / "chat.trl.jsonl")
    assert code == 0, stderr
    assert back == [record]


def test_trl_prompt_completion_rows_read_as_outputs(tmp_path):
    """A prompt-completion file is an output file too: its generator column, else the file's name."""
    named = write(
        tmp_path / "named.jsonl",
        [{"prompt": "Say hi.", "completion": "Hi!", "generator": "mine"}],
    )
    plain = write(tmp_path / "outputs_rlhf.jsonl", [{"prompt": "Say hi.", "completion": "Hi!"}])
    [record] = read_records(named, "output")
    assert (record["instruction"], record["output"], record["generator"]) == (
        "Say hi.",
        "Hi!",
        "mine",
    )
    [record] = read_records(plain, "output")
    assert record["generator"] == "outputs_rlhf"
    code, back, stderr = convert(plain, "--kind", "output")
    assert code == 0, stderr
    assert back == [
        {"instruction": "Say hi.", "input": "", "output": "Hi!", "generator": "outputs_rlhf"}
    ]
    assert "as TRL prompt / prompt-completion rows" in stderr


def test_preference_fields_follow_the_chosen_output(tmp_path):
    """The fields of a pair's two sides (generator_1, generator_2) go out with the outputs: when the
    second output was chosen it is TRL's `chosen`, with its generator in generator_1; read back, both
    return to position 2."""
    prefs = [
        {
            "instruction": "a",
            "input": "",
            "output_1": "x",
            "output_2": "y",
            "generator_1": "base",
            "generator_2": "ppo",
            "preference": 2,
            "annotator": "gold",
        }
    ]
    source = write(tmp_path / "prefs.jsonl", prefs)
    code, _, stderr = convert(source, "--to", "trl", "-o", tmp_path / "prefs.trl.jsonl")
    assert code == 0, stderr
    [row] = read_records(tmp_path / "prefs.trl.jsonl")
    assert row == {
        "prompt": "a",
        "chosen": "y",
        "rejected": "x",
        "generator_1": "ppo",
        "generator_2": "base",
        "farmkit_chosen": 2,
        "annotator": "gold",
    }
    code, back, stderr = convert(tmp_path / "prefs.trl.jsonl")
    assert code == 0, stderr
    assert back == prefs


def test_alpacafarm_outputs_are_named_on_stderr(tmp_path):
    """The published outputs are detected like every other format: stderr says how the file is read."""
    path = tmp_path / "outputs_sft.json"
    path.write_bytes(orjson.dumps([{"instruction": "a", "input": "", "output": "b"}]))
    code, back, stderr = convert(path, "--kind", "output")
    assert code == 0, stderr
    assert back[0]["generator"] == "outputs_sft"
    assert f"reading {path} as AlpacaFarm/AlpacaEval outputs without a generator" in stderr


def winrate_board(path) -> list[dict]:
    from click.testing import CliRunner
    from farmkit.tools.farm_winrate import cli

    result = CliRunner().invoke(cli, [str(path), "--no-length-control"])
    assert result.exit_code == 0, result.stderr
    return [orjson.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize("target", ["trl", "trl-chat"])
@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_preferences_round_trip_through_trl_whole(tmp_path, target, suffix):
    """farmkit -> TRL -> farmkit gives the same records back (order of the two outputs, their
    generators, the verdict, soft labels), and so the same farm-winrate board: claude, in position
    2 against the reference, wins nearly every item before and after."""
    if suffix == "parquet":
        pytest.importorskip("pyarrow")
    verdicts = [2, 2, 2, 1, 2.0, 1.0, 1.75, 1.2, 2]
    prefs = [
        {
            "instruction": f"task {i}",
            "input": "some input" if i % 3 == 0 else "",
            "output_1": f"davinci answer {i}",
            "output_2": f"claude answer {i}",
            "generator_1": "text_davinci_003",
            "generator_2": "claude",
            "preference": verdict,
            "annotator": "gold",
            "id": i,
        }
        for i, verdict in enumerate(verdicts)
    ]
    source = write(tmp_path / "prefs.jsonl", prefs)
    out = tmp_path / f"prefs.trl.{suffix}"
    code, _, stderr = convert(source, "--to", target, "-o", out)
    assert code == 0, stderr
    rows = list(read_records(out))
    # TRL's own view holds: chosen is the preferred output, whichever position it had
    assert [row["chosen"] if target == "trl" else row["chosen"][0]["content"] for row in rows] == [
        p["output_2"] if p["preference"] > 1.5 else p["output_1"] for p in prefs
    ]
    back_path = tmp_path / "back.jsonl"
    code, back, stderr = convert(out, "-o", back_path)
    assert code == 0, stderr
    back = list(read_records(back_path))
    assert back == prefs
    before, after = winrate_board(source), winrate_board(back_path)
    assert after == before
    assert [(row["generator"], row["win_rate"]) for row in after if row["generator"] == "claude"]
