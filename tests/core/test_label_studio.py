"""Label Studio through farm-convert: pairs -> tasks to import, and its JSON export -> preference
records, round trip through an export built the way Label Studio writes one."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools.farm_convert import cli, main

from farmkit.core.label_studio import LABEL_STUDIO_CONFIG

PAIRS = [
    {
        "instruction": f"Task {i}",
        "input": "" if i % 2 else f"context {i}",
        "output_1": f"first answer {i}",
        "output_2": f"second answer {i}",
        "generator_1": "ref",
        "generator_2": "sft",
        "id": f"pair-{i}",
    }
    for i in range(6)
]
# what three people answered, by pair: (preference, strength)
LABELS = {
    "alice": [
        (1.0, "much"),
        (2.0, "slightly"),
        (1.5, None),
        (2.0, "much"),
        (1.0, None),
        (2.0, None),
    ],
    "bob": [
        (2.0, "much"),
        (2.0, "much"),
        (1.0, "slightly"),
        (1.5, None),
        (1.0, "much"),
        (1.0, None),
    ],
    "7": [
        (1.0, "slightly"),
        (1.5, None),
        (2.0, "slightly"),
        (2.0, "much"),
        (2.0, "much"),
        (1.0, None),
    ],
}
STRENGTHS = {"much": "much better", "slightly": "slightly better"}


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def annotation(task, who, preference, strength, number):
    """One annotation as Label Studio exports it: the side selected in the Pairwise control, the
    strength (or a tie) in the Choices control; who as a user id or a user object."""
    result = []
    if preference == 1.5:
        result.append(choice("about the same"))
    else:
        chosen = "output_1" if preference == 1.0 else "output_2"
        side = "left" if task["data"]["farmkit_left"] == chosen else "right"
        result.append(
            {
                "id": f"r{number}",
                "from_name": "preference",
                "to_name": "left,right",
                "type": "pairwise",
                "origin": "manual",
                "value": {"selected": side},
            }
        )
        if strength:
            result.append(choice(STRENGTHS[strength]))
    return {
        "id": number,
        "completed_by": int(who) if who.isdigit() else {"id": number, "email": who},
        "result": result,
        "was_cancelled": False,
        "ground_truth": False,
        "created_at": "2026-11-28T10:00:00.000000Z",
        "updated_at": "2026-11-28T10:00:00.000000Z",
        "lead_time": 4.5,
        "task": task["id"],
    }


def choice(value):
    return {
        "from_name": "strength",
        "to_name": "left",
        "type": "choices",
        "origin": "manual",
        "value": {"choices": [value]},
    }


def export_of(tasks):
    """The export Label Studio writes once the tasks are labelled, with a cancelled annotation and
    one that chose nothing, which must not count."""
    exported = []
    for i, task in enumerate(tasks):
        task = {"id": 100 + i, **task, "project": 1}
        annotations = [
            annotation(task, who, *LABELS[who][i], number=10 * i + k)
            for k, who in enumerate(LABELS)
        ]
        annotations.append({**annotations[0], "id": 999, "was_cancelled": True})
        annotations.append({**annotations[0], "id": 998, "result": []})
        exported.append({**task, "annotations": annotations, "predictions": []})
    return exported


def test_pairs_to_tasks_to_export_to_preferences(tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    tasks_path, config = tmp_path / "tasks.json", tmp_path / "config.xml"
    result = CliRunner().invoke(
        cli,
        [str(pairs), "--to", "label-studio", "--label-config", str(config), "-o", str(tasks_path)],
    )
    assert result.exit_code == 0, result.output
    assert config.read_text() == LABEL_STUDIO_CONFIG
    tasks = orjson.loads(tasks_path.read_bytes())
    assert [task["data"]["id"] for task in tasks] == [pair["id"] for pair in PAIRS]
    for task, pair in zip(tasks, PAIRS, strict=True):
        left = task["data"]["farmkit_left"]
        right = "output_2" if left == "output_1" else "output_1"
        assert (task["data"]["left"], task["data"]["right"]) == (pair[left], pair[right])
    sides = [task["data"]["farmkit_left"] for task in tasks]
    assert set(sides) == {"output_1", "output_2"}  # the order shown is drawn per pair
    again = CliRunner().invoke(cli, [str(pairs), "--to", "label-studio"])
    assert orjson.loads(again.stdout) == tasks  # seeded
    export = tmp_path / "project-1-at-2026-11-28.json"
    export.write_bytes(orjson.dumps(export_of(tasks)))
    back = CliRunner().invoke(cli, [str(export)])
    assert back.exit_code == 0, back.output
    records = [orjson.loads(line) for line in back.stdout.splitlines()]
    expected = [
        {
            **pair,
            "preference": preference,
            "strength": strength,
            "annotator": who,
            "shown": [side, "output_2" if side == "output_1" else "output_1"],
            "seconds": 4.5,
            "time": "2026-11-28T10:00:00.000000Z",
        }
        for pair, side, i in zip(PAIRS, sides, range(len(PAIRS)), strict=True)
        for who in LABELS
        for preference, strength in [LABELS[who][i]]
    ]
    assert records == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda task: task["annotations"][0]["result"][0]["value"].update(selected="middle"),
            "task 101: a pairwise result selects 'middle'; expected 'left' or 'right'",
        ),
        (
            lambda task: task["annotations"][0].pop("completed_by"),
            "task 101: annotation 10 names no annotator; expected `completed_by`",
        ),
        (
            lambda task: task["data"].pop("output_2"),
            "task 101: the task's data has no text 'output_2'; expected a pair's fields",
        ),
    ],
)
def test_a_bad_export_names_the_file_and_the_task(tmp_path, capfd, change, message):
    tasks = orjson.loads(
        CliRunner()
        .invoke(
            cli,
            ["-", "--to", "label-studio"],
            input=b"".join(orjson.dumps(pair) + b"\n" for pair in PAIRS[:3]),
        )
        .stdout
    )
    exported = export_of(tasks)
    # a pairwise result first, whichever the first annotation's verdict
    exported[1]["annotations"][0] = annotation(
        {**exported[1], "id": 101}, "alice", 2.0, "much", number=10
    )
    change(exported[1])
    path = tmp_path / "export.json"
    path.write_bytes(orjson.dumps(exported))
    with pytest.raises(SystemExit) as exit_info:
        main([str(path)])
    captured = capfd.readouterr()
    assert (exit_info.value.code, captured.out) == (1, "")
    assert captured.err.startswith(f"farm-convert: error: {path}:2: {message}")


def test_label_config_without_label_studio_is_a_usage_error(tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
    result = CliRunner().invoke(cli, [str(pairs), "--label-config", str(tmp_path / "c.xml")])
    assert result.exit_code == 2
    assert "--label-config goes with --to label-studio" in result.stderr
