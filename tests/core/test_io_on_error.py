"""--on-error fail|skip: the tools that read users' files stop at a bad record (the default) or leave
bad records out, naming the first few (FILE:LINE: reason) and counting them on stderr, never silently."""

from __future__ import annotations

import gzip

import orjson
import pytest
from click.testing import CliRunner
from conftest import shared_data

from farmkit.core.io import bad_records

HH = "\n\nHuman: {q}\n\nAssistant: {a}"


def hh(i: int) -> dict:
    return {
        "chosen": HH.format(q=f"question {i}", a=f"kind answer {i}"),
        "rejected": HH.format(q=f"question {i}", a=f"rude answer {i}"),
    }


def mixed_file(path) -> list[int]:
    """Six good hh-rlhf pairs and three bad lines; returns the bad lines' numbers."""
    lines = [orjson.dumps(hh(i)) for i in range(3)]
    lines.append(
        b'{"chosen": "\\n\\nHuman: hi\\n\\nAssistant: a", "rejected": '
    )  # line 4: cut JSON
    lines.append(orjson.dumps(hh(3)))
    lines.append(  # line 6: the two sides continue different conversations
        orjson.dumps(
            {"chosen": HH.format(q="one", a="x"), "rejected": HH.format(q="another", a="y")}
        )
    )
    lines.append(orjson.dumps(hh(4)))
    lines.append(orjson.dumps({"chosen": HH.format(q="q", a="a")}))  # line 8: no rejected
    lines.append(orjson.dumps(hh(5)))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return [4, 6, 8]


def convert(*args):
    from farmkit.tools.farm_convert import cli

    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result


def test_fail_is_the_default_and_names_the_first_bad_line(tmp_path):
    path = tmp_path / "hh.jsonl"
    mixed_file(path)
    result = convert(path, "--kind", "preference")
    assert result.exit_code == 1
    assert str(result.exception).startswith(f"{path}:4: not valid JSON")
    assert result.stdout == ""


def test_skip_leaves_bad_records_out_and_reports_each_and_the_count(tmp_path):
    path = tmp_path / "hh.jsonl"
    bad = mixed_file(path)
    result = convert(path, "--kind", "preference", "--on-error", "skip")
    assert result.exit_code == 0, result.output
    records = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [r["instruction"] for r in records] == [f"question {i}" for i in range(6)]
    assert [r["output_1"] for r in records] == [f"kind answer {i}" for i in range(6)]
    for line, reason in zip(
        bad,
        ("not valid JSON", "continue different conversations", "missing field 'rejected'"),
        strict=True,
    ):
        assert f"{path}:{line}: " in result.stderr and reason in result.stderr
    assert f"{path}: skipped 3 bad record(s) of 9 (--on-error skip" in result.stderr
    assert bad_records().mode == "fail"  # the next command in this process starts over


def test_skip_names_only_the_first_few_but_counts_them_all(tmp_path):
    path = tmp_path / "many.jsonl"
    good = [orjson.dumps(hh(i)) for i in range(3)]
    path.write_bytes(b"\n".join(good + [b"{not json"] * 40) + b"\n")
    result = convert(path, "--on-error", "skip")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3
    assert result.stderr.count("not valid JSON") == 5
    assert "skipped 40 bad record(s) of 43" in result.stderr


def test_a_file_of_bad_records_only_is_still_an_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"{not json\n[1, 2]\n")
    result = convert(path, "--kind", "preference", "--on-error", "skip")
    assert result.exit_code == 1
    assert str(result.exception).startswith(f"{path}: every record (2) is bad")


@pytest.mark.parametrize(
    ("tool", "head"),
    [
        ("farm-rm-train", ["embedded"]),
        ("farm-dpo", ["embedded"]),
        ("farm-sft", ["embedded"]),
        ("farm-annotate", []),
        ("farm-winrate", []),
        ("farm-convert", []),
    ],
)
def test_the_tools_that_read_users_files_take_on_error(tmp_path, tool, head, run_farm):
    """Each of them: skip reports the bad lines of its input; a file of nothing but bad records stops
    it before any work (no model is loaded)."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"{not json\n" + orjson.dumps({"instruction": 3}) + b"\n")
    output = (
        ["-o", str(tmp_path / "out")] if tool in ("farm-rm-train", "farm-dpo", "farm-sft") else []
    )
    done = run_farm(tool, *head, str(path), *output, "--on-error", "skip", timeout=120)
    assert done.returncode == 1, done.stderr.decode()
    stderr = done.stderr.decode()
    assert f"{path}:1: not valid JSON" in stderr
    assert f"{path}:2: " in stderr
    assert f"{path}: every record (2) is bad" in stderr
    assert "Traceback" not in stderr


def test_winrate_skips_bad_preferences_and_counts_them(tmp_path):
    from farmkit.tools.farm_winrate import cli

    path = tmp_path / "prefs.jsonl.gz"
    rows = [
        {"instruction": f"t{i}", "generator_1": "ref", "generator_2": "m", "preference": 2}
        for i in range(4)
    ]
    lines = [orjson.dumps(r) for r in rows]
    lines.insert(2, b'{"instruction": "t9", "generator_1": "ref"')
    lines.insert(4, orjson.dumps({**rows[0], "preference": "two"}))
    with gzip.open(path, "wb") as stream:
        stream.write(b"\n".join(lines) + b"\n")
    failed = CliRunner().invoke(cli, [str(path), "--no-length-control"])
    assert failed.exit_code == 1 and str(failed.exception).startswith(f"{path}:3: not valid JSON")
    result = CliRunner().invoke(cli, [str(path), "--no-length-control", "--on-error", "skip"])
    assert result.exit_code == 0, result.output
    (row,) = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert row["n_total"] == 4 and row["win_rate"] == 100
    assert f"{path}:3: not valid JSON" in result.stderr and f"{path}:5: " in result.stderr
    assert f"{path}: skipped 2 bad record(s) of 6" in result.stderr


def test_the_real_hh_rlhf_file_reads_whole_but_for_its_malformed_transcripts():
    """anthropics/hh-rlhf harmless-base test: 2,312 pairs, 5 of them with transcripts whose two sides
    do not share the conversation before the last assistant turn."""
    path = shared_data("human_prefs/hh_rlhf_harmless_base_test.jsonl.gz")
    failed = convert(path, "--kind", "preference")
    assert failed.exit_code == 1 and "continue different conversations" in str(failed.exception)
    result = convert(path, "--kind", "preference", "--on-error", "skip")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2307
    assert f"{path}: skipped 5 bad record(s) of 2,312" in result.stderr
    assert result.stderr.count("continue different conversations") == 5
