"""Drift canaries (farm-winrate --canaries FROZEN): tonight's verdicts on the frozen pairs against
their first verdicts, the exact binomial test against the frozen self-agreement, exit 4 and one line
on a drift, the history row and the plot's mark. The recipe end to end (a judge replaced overnight)
is tests/examples/test_nightly.py::test_canaries_catch_a_judge_replaced_overnight."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools.farm_plot import cli as plot_cli
from farmkit.tools.farm_winrate import cli
from scipy import stats


def canary(i, preference, swapped=False):
    outputs = [f"short {i}", f"a longer answer {i}"]
    if swapped:
        outputs.reverse()
        preference = {1: 2, 2: 1}.get(preference, preference)
    return {
        "instruction": f"canary {i}",
        "input": "",
        "output_1": outputs[0],
        "output_2": outputs[1],
        "preference": preference,
    }


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    return path


@pytest.fixture
def frozen(tmp_path):
    """20 canaries frozen twice: 19 of the 20 repeats agree (p0 = 19.5 / 21)."""
    first = [canary(i, 2) for i in range(20)]
    second = [canary(i, 2 if i else 1) for i in range(20)]
    return write_jsonl(tmp_path / "frozen.jsonl", first + second)


def invoke(*args):
    return CliRunner().invoke(cli, [str(arg) for arg in args], catch_exceptions=False)


def test_canaries_as_frozen_are_no_drift(tmp_path, frozen):
    # tonight's pairs shown the other way round (farm-annotate may swap them): still the same verdict
    tonight = write_jsonl(
        tmp_path / "tonight.jsonl", [canary(i, 2, swapped=i % 2) for i in range(20)]
    )
    history = tmp_path / "history.jsonl"
    result = invoke(tonight, "--canaries", frozen, "--history", history)
    assert result.exit_code == 0, result.output
    (row,) = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert row["canary_agreement"] == 100 and row["n_canaries"] == 20
    assert row["canary_baseline"] == pytest.approx(100 * 19.5 / 21)
    assert row["judge_drift"] is False and row["canary_p_value"] == 1.0
    assert "no drift" in result.stderr
    (entry,) = [orjson.loads(line) for line in history.read_bytes().splitlines()]
    assert entry["kind"] == "canary" and entry["evaluated_at"]
    history.write_bytes(  # beside a board row: the plot has a line, and no drift mark
        b'{"evaluated_at": "2026-01-01T02:30:00Z", "generator": "ppo", "reference": "ref", '
        b'"win_rate": 60.0}\n' + history.read_bytes()
    )
    figure = tmp_path / "history.png"
    drawn = CliRunner().invoke(plot_cli, ["history", str(history), "-o", str(figure)])
    assert drawn.exit_code == 0, drawn.output
    assert _red_pixels(figure) == 0


def test_a_drift_prints_one_line_exits_4_and_is_marked(tmp_path, frozen):
    # 12 of 20 agree: P(Binomial(20, 19.5/21) <= 12) is far below 0.01
    tonight = write_jsonl(
        tmp_path / "tonight.jsonl", [canary(i, 2 if i < 12 else 1) for i in range(20)]
    )
    history = tmp_path / "history.jsonl"
    write_jsonl(  # an earlier night's board row
        history,
        [
            {
                "evaluated_at": "2026-01-01T02:30:00Z",
                "generator": "ppo",
                "reference": "ref",
                "win_rate": 60.0,
            }
        ],
    )
    result = invoke(tonight, "--canaries", frozen, "--history", history, "-q")
    assert result.exit_code == 4
    expected_p = stats.binom.cdf(12, 20, 19.5 / 21)
    (row,) = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert row["canary_p_value"] == pytest.approx(expected_p, rel=1e-12) and row["judge_drift"]
    (line,) = result.stderr.splitlines()  # one line, even with -q
    assert line.startswith(
        "farm-winrate: judge drift: the canaries agree with their frozen verdicts on 12 of 20 (60%) "
        "against a self-agreement of 93% when frozen (one-sided exact binomial test p = "
    )
    assert [orjson.loads(x).get("judge_drift") for x in history.read_bytes().splitlines()] == [
        None,
        True,
    ]
    figure = tmp_path / "history.png"
    drawn = CliRunner().invoke(plot_cli, ["history", str(history), "-o", str(figure)])
    assert drawn.exit_code == 0, drawn.output
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _red_pixels(figure) > 200  # the drift's dashed red line and its label


def _red_pixels(path) -> int:
    """Pixels of matplotlib's tab:red (214, 39, 40) in a PNG: what marks a drift."""
    from matplotlib.image import imread

    pixels = imread(path)[:, :, :3] * 255
    return int((abs(pixels - [214, 39, 40]).max(axis=2) < 30).sum())


def test_a_judge_without_verdicts_tonight_is_a_drift(tmp_path, frozen):
    tonight = write_jsonl(tmp_path / "tonight.jsonl", [canary(i, None) for i in range(20)])
    assert invoke(tonight, "--canaries", frozen).exit_code == 4


def test_frozen_canaries_need_two_runs(tmp_path, capfd):
    from farmkit.tools.farm_winrate import main

    once = write_jsonl(tmp_path / "once.jsonl", [canary(i, 2) for i in range(5)])
    with pytest.raises(SystemExit) as exit:  # the console script's main, in this process
        main([str(once), "--canaries", str(once)])
    assert exit.value.code == 1
    assert "once.jsonl: no canary was asked twice" in capfd.readouterr().err


def test_canaries_with_a_board_option_is_a_usage_error(tmp_path, frozen):
    result = invoke(frozen, "--canaries", frozen, "--baseline", "x")
    assert result.exit_code == 2 and "--canaries" in result.output


def _answered_by(records, reply_model, fingerprint):
    """The records as farm-annotate writes an endpoint's verdicts: what answered in provenance."""
    said = {"model": "judge", "reply_model": reply_model, "system_fingerprint": fingerprint}
    return [{**r, "provenance": {"farm-annotate": said}} for r in records]


def test_a_changed_fingerprint_is_reported_and_kept_but_is_not_a_drift(tmp_path):
    """The endpoint's fingerprint (the reply's model and system_fingerprint in the verdicts'
    provenance) frozen with the canaries, against tonight's: a change is one line on stderr and a
    field in the history row; with the verdicts as frozen, not a drift (exit 0)."""
    first = [canary(i, 2) for i in range(20)]
    second = [canary(i, 2 if i else 1) for i in range(20)]
    frozen = write_jsonl(tmp_path / "frozen.jsonl", _answered_by(first + second, "j-1", "fp_a"))
    tonight = write_jsonl(tmp_path / "tonight.jsonl", _answered_by(first, "j-1", "fp_b"))
    history = tmp_path / "history.jsonl"
    result = invoke(tonight, "--canaries", frozen, "--history", history)
    assert result.exit_code == 0, result.output
    (row,) = [orjson.loads(line) for line in history.read_bytes().splitlines()]
    assert row["judge_drift"] is False and row["judge_fingerprint_changed"] is True
    assert row["frozen_fingerprints"] == ["j-1 fp_a"]
    assert row["tonight_fingerprints"] == ["j-1 fp_b"]
    (line,) = [x for x in result.stderr.splitlines() if "fingerprint" in x]
    assert line.startswith(
        "farm-winrate: the judge's fingerprint changed: frozen with j-1 fp_a, tonight j-1 fp_b"
    )
    # the same fingerprint: said as unchanged; none given on either side: unknown, and no line
    same = write_jsonl(tmp_path / "same.jsonl", _answered_by(first, "j-1", "fp_a"))
    result = invoke(same, "--canaries", frozen, "-o", tmp_path / "row.jsonl")
    assert result.exit_code == 0 and "fingerprint" not in result.stderr
    assert orjson.loads((tmp_path / "row.jsonl").read_bytes())["judge_fingerprint_changed"] is False
    plain = write_jsonl(tmp_path / "plain.jsonl", first)
    result = invoke(plain, "--canaries", frozen, "-o", tmp_path / "row.jsonl")
    assert result.exit_code == 0 and "fingerprint" not in result.stderr
    assert orjson.loads((tmp_path / "row.jsonl").read_bytes())["judge_fingerprint_changed"] is None
