"""Datasets by name (issue 21, item 4): every input argument takes a Hugging Face dataset, a name
(`trl-lib/Capybara`), a local dataset folder (save_to_disk, or a folder of parquet/json files),
`NAME:SPLIT` or `--split`, read through the same format readers as files. No network here: the
folders are made in tmp_path and the hub is either offline or stood in for."""

from __future__ import annotations

import orjson
import pytest
from conftest import run_tool

from farmkit.core.io import FarmError, read_records, set_split

datasets = pytest.importorskip("datasets")

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(autouse=True)
def _default_split():
    yield
    set_split(None)


def _saved_splits(folder, splits):
    datasets.DatasetDict(
        {name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}
    ).save_to_disk(str(folder))
    return str(folder)


def _prompts(tag, n=2):
    return [{"prompt": f"{tag} prompt {i}", "completion": f"{tag} answer {i}"} for i in range(n)]


def test_a_saved_dataset_dict_reads_train_by_default_and_any_split_by_name(tmp_path):
    folder = _saved_splits(tmp_path / "dd", {"train": _prompts("tr"), "test": _prompts("te", 3)})
    train = list(read_records(folder, "instruction"))
    assert [r["instruction"] for r in train] == ["tr prompt 0", "tr prompt 1"]
    test = list(read_records(f"{folder}:test", "instruction"))
    assert [r["output"] for r in test] == ["te answer 0", "te answer 1", "te answer 2"]
    set_split("test")  # what --split does
    assert len(list(read_records(folder, "instruction"))) == 3


def test_a_split_that_is_not_there_is_named_with_the_ones_that_are(tmp_path):
    folder = _saved_splits(tmp_path / "dd", {"train": _prompts("tr"), "test": _prompts("te")})
    with pytest.raises(FarmError, match=r"no split 'valid'.*train, test"):
        list(read_records(f"{folder}:valid", "instruction"))


def test_several_splits_without_train_ask_for_one(tmp_path):
    folder = _saved_splits(tmp_path / "dd", {"a": _prompts("a"), "b": _prompts("b")})
    with pytest.raises(FarmError, match=r"several splits \(a, b\).*:SPLIT.*--split"):
        list(read_records(folder, "instruction"))


def test_a_folder_of_data_files_is_a_dataset(tmp_path):
    folder = tmp_path / "repo"
    (folder / "data").mkdir(parents=True)
    for split, tag in (("train", "tr"), ("test", "te")):
        rows = [
            {
                "messages": [
                    {"role": "user", "content": f"{tag} q{i}"},
                    {"role": "assistant", "content": "a"},
                ]
            }
            for i in range(2)
        ]
        (folder / "data" / f"{split}.jsonl").write_bytes(
            b"".join(orjson.dumps(r) + b"\n" for r in rows)
        )
    records = list(read_records(f"{folder}:test", "output"))
    assert [r["instruction"] for r in records] == ["te q0", "te q1"]
    assert list(read_records(folder, "instruction"))[0]["instruction"] == "tr q0"


def test_rows_of_a_dataset_name_their_row_when_bad(tmp_path):
    folder = _saved_splits(tmp_path / "dd", {"train": [{"text": "no prompt here"}]})
    with pytest.raises(FarmError, match=r"dd:train:1: .*instruction"):
        list(read_records(folder, "instruction"))


def test_a_hub_name_is_loaded_with_datasets_and_its_split(tmp_path, monkeypatch):
    calls = []
    rows = datasets.Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": "hi"}],
                "chosen": [{"role": "assistant", "content": "yes"}],
                "rejected": [{"role": "assistant", "content": "no"}],
            }
        ]
    )

    def load_dataset(name, split=None, **kwargs):
        calls.append((name, split))
        return rows if split else datasets.DatasetDict(train=rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    [record] = read_records("trl-lib/ultrafeedback_binarized:test", "preference")
    assert calls[-1] == ("trl-lib/ultrafeedback_binarized", "test")
    assert (record["instruction"], record["output_1"], record["preference"]) == ("hi", "yes", 1.0)
    list(read_records("trl-lib/Capybara", "preference"))
    assert calls[-1][0] == "trl-lib/Capybara"


def test_offline_a_name_neither_cached_nor_a_folder_says_so(tmp_path, monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FarmError) as caught:
        list(read_records("nobody-here/no-such-dataset", "instruction"))
    message = str(caught.value)
    assert message.startswith("nobody-here/no-such-dataset: cannot open")
    assert "no such file or folder" in message and "not in the local cache" in message
    assert "offline" in message


def test_a_missing_plain_file_keeps_its_cannot_open_error(tmp_path):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(FarmError, match=rf"^{missing}: cannot open: No such file"):
        list(read_records(missing, "instruction"))


# -- the tools ------------------------------------------------------------------------------


def _outputs(tag, generator):
    return [
        {
            "instruction": f"Describe volcanoes, case {i}",
            "output": f"{tag} Volcanoes form where magma rises {i}.",
            "generator": generator,
        }
        for i in range(3)
    ]


def test_farm_annotate_reads_dataset_folders_and_split(tmp_path):
    outputs = _saved_splits(
        tmp_path / "outs", {"train": _outputs("x", "m"), "test": _outputs("y", "m2")}
    )
    reference = _saved_splits(tmp_path / "ref", {"train": _outputs("ref", "ref")})
    done = run_tool(
        "farm-annotate",
        outputs,
        "--split",
        "test",
        "--reference",
        f"{reference}:train",
        "--pool",
        "sim_eval_offline",
        "--no-cache",
        env=OFFLINE,
    )
    assert done.returncode == 0, done.stderr.decode()
    records = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [r["generator_2"] for r in records] == ["m2"] * 3
    assert all(r["generator_1"] == "ref" for r in records)


@pytest.mark.parametrize(
    "tool, args",
    [
        ("farm-sft", ["embedded"]),
        ("farm-dpo", ["embedded"]),
        ("farm-rm-train", ["embedded"]),
        ("farm-sample", ["embedded"]),
        ("farm-annotate", []),
    ],
)
def test_every_tool_says_when_a_name_is_neither_cached_nor_a_folder(tmp_path, tool, args):
    done = run_tool(
        tool, *args, "nobody-here/no-such-dataset", "-o", str(tmp_path / "out"), env=OFFLINE
    )
    assert done.returncode == 1, done.stderr.decode()
    last = done.stderr.decode().strip().splitlines()[-1]
    assert "nobody-here/no-such-dataset: cannot open" in last and "not in the local cache" in last
    assert "Traceback" not in done.stderr.decode()


@pytest.mark.parametrize(
    "tool, args, kind",
    [
        ("farm-sft", ["embedded"], "instruction"),
        ("farm-dpo", ["embedded"], "preference"),
        ("farm-rm-train", ["embedded"], "preference"),
        ("farm-sample", ["embedded"], "instruction"),
    ],
)
def test_every_training_tool_reads_a_dataset_folder_split(tmp_path, tool, args, kind):
    """The folder's `bad` split is read (its first row named in the error), its good train split not:
    the tool went through the dataset reader with --split, and stopped before loading a model."""
    folder = _saved_splits(
        tmp_path / "dd",
        {
            "train": [{"prompt": "p", "chosen": "a", "rejected": "b", "completion": "c"}],
            "bad": [{"text": "nothing a tool can use"}],
        },
    )
    done = run_tool(tool, *args, folder, "--split", "bad", "-o", str(tmp_path / "out"), env=OFFLINE)
    assert done.returncode == 1, done.stderr.decode()
    assert f"{folder}:bad:1:" in done.stderr.decode(), done.stderr.decode()[-2000:]


def test_a_folder_of_json_files_keeps_values_as_written_and_names_file_and_line(tmp_path):
    """datasets' own JSON loader types a column of mixed types as JSON and decodes the strings in it
    ("3" becomes 3); farmkit reads a folder's JSON files itself, so values stay as written and a bad
    row is named by its file and line."""
    folder = tmp_path / "prefs"
    (folder / "data").mkdir(parents=True)
    rows = [
        {"prompt": "Larger, 2 or 3?", "chosen": "3", "rejected": "2"},
        {"prompt": "Spell cat.", "chosen": 7, "rejected": "k a t"},
    ]
    train = folder / "data" / "train.jsonl"
    train.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    with pytest.raises(FarmError, match=rf"^{train}:2: "):
        list(read_records(folder, "preference"))
    train.write_bytes(orjson.dumps(rows[0]) + b"\n")
    [record] = read_records(folder, "preference")
    assert (record["output_1"], record["output_2"]) == ("3", "2")


def test_farm_eval_takes_datasets_for_outputs_and_reference(tmp_path):
    outputs = _saved_splits(
        tmp_path / "outs", {"train": _outputs("x", "m"), "test": _outputs("y", "m2")}
    )
    reference = tmp_path / "ref"
    (reference / "data").mkdir(parents=True)
    (reference / "data" / "train.jsonl").write_bytes(
        b"".join(orjson.dumps(r) + b"\n" for r in _outputs("ref", "ref"))
    )
    done = run_tool(
        "farm-eval",
        f"{outputs}:test",
        "--reference",
        str(reference),
        "--pool",
        "sim_eval_offline",
        "--no-cache",
        "--bootstrap",
        "0",
        env=OFFLINE,
    )
    assert done.returncode == 0, done.stderr.decode()
    [row] = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert (row["generator"], row["reference"], row["n_total"]) == ("m2", "ref", 3)
    missing = run_tool(
        "farm-eval",
        "nobody-here/outputs",
        "--reference",
        str(reference),
        "--pool",
        "gold",
        env=OFFLINE,
    )
    assert missing.returncode == 1 and "not in the local cache" in missing.stderr.decode()
