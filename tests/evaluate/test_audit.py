"""farm-audit: a judge's audit from offline judges whose biases are known (an oracle that always
prefers the first shown output, one that prefers the longer output, and a coin-flipping fair one),
and against AlpacaEval's evaluators' leaderboard on the shared data."""

from __future__ import annotations

import csv
import json
import random

import orjson
import pytest
from click.testing import CliRunner
from conftest import shared_data

from tools.farm_audit import cli

WORDS = "alpha beta gamma delta omega sigma theta kappa".split()  # five letters each
RUNNER = CliRunner()


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """200 pairs of word lists whose lengths (words and characters alike) differ, each output
    written by m1 or m2, and three oracle judges."""
    where = tmp_path_factory.mktemp("audit")
    rng = random.Random(0)
    pairs = []
    for i in range(200):
        sizes = rng.sample(range(3, 40), 2)  # never equal: one output is the longer
        texts = [" ".join(rng.choice(WORDS) for _ in range(size)) + "." for size in sizes]
        pairs.append(
            {
                "instruction": f"Task {i}: list some words",
                "input": "",
                "output_1": texts[0],
                "output_2": texts[1],
                "generator_1": "m1" if i % 2 else "m2",
                "generator_2": "m2" if i % 2 else "m1",
            }
        )
    write_jsonl(where / "pairs.jsonl", pairs)
    judges = {
        "first": "temperature: 0.0, position_bias: 100.0",
        "longer": "temperature: 0.0, length_bias: 100.0",
        "fair": "temperature: 1000.0",  # a coin flip on every question, whatever the order or length
    }
    for name, settings in judges.items():
        (where / f"{name}.yaml").write_text(
            f"name: {name}\ndescription: a test judge\nflip_rate: 0.0\njudges:\n"
            f"  - {{name: {name}, backend: oracle, reward: heuristic, {settings}}}\n"
        )
    return where


def run(folder, judge, *args, resamples="200"):
    return RUNNER.invoke(
        cli,
        [str(folder / "pairs.jsonl"), "--pool", str(folder / f"{judge}.yaml"), "--no-cache"]
        + ["--bootstrap", resamples, *args],
    )


def figures(result) -> dict[str, dict]:
    return {row["figure"]: row for row in map(orjson.loads, result.stdout.splitlines())}


def test_a_judge_that_prefers_the_first_shown_output_fails_the_check(folder):
    result = run(folder, "first", "--format", "jsonl", "--fail-on", "p_prefers_first>0.8")
    assert result.exit_code == 3, result.output
    assert "--fail-on: p_prefers_first = 1 > 0.8" in result.stderr
    found = figures(result)
    assert found["p_prefers_first"]["estimate"] == 1.0 and found["p_prefers_first"]["n"] == 200
    assert found["flip_rate"]["estimate"] == 1.0
    # shown both ways, the first position is the longer output as often as the shorter
    assert found["p_prefers_longer"]["estimate"] == 0.5
    for row in found.values():
        assert set(row) >= {"estimate", "ci_low", "ci_high", "n"}


def test_a_judge_that_prefers_the_longer_output(folder):
    result = run(folder, "longer", "--format", "jsonl", "--fail-on", "flip_rate>0.2")
    assert result.exit_code == 0, result.output
    found = figures(result)
    assert found["p_prefers_longer"]["estimate"] == 1.0
    assert found["p_prefers_first"]["estimate"] == 0.5 and found["flip_rate"]["estimate"] == 0.0
    assert found["length_coefficient"]["ci_low"] > 1  # the GLM's length term, clear of 0


def test_a_fair_judge_prefers_neither(folder):
    """A coin flip per question (seeded: the same draws every run). P(prefers first) counts 200 pairs
    x 2 orders x 3 runs = 1,200 verdicts (standard error 0.014), P(prefers longer) the first run's
    verdicts on the pairs whose lengths differ by more than 30 characters, both orders (about 300:
    standard error 0.029): 0.5 +- 0.15 is over 5 standard errors for both, no seed fails it."""
    result = run(
        folder,
        "fair",
        "--format",
        "jsonl",
        "--fail-on",
        "p_prefers_first>0.7",
        "--fail-on",
        "p_prefers_longer>0.7",
    )
    assert result.exit_code == 0, result.output
    found = figures(result)
    for name in ("p_prefers_first", "p_prefers_longer"):
        row = found[name]
        assert abs(row["estimate"] - 0.5) < 0.15, row
        assert row["n"] > 140, row
    assert found["variance"]["estimate"] > 0.3  # three runs that disagree: it samples


def test_the_report_the_humans_and_the_plot(folder, tmp_path):
    """With human labels (here: the longer output, as the `longer` judge sees it) the report has
    agreement, kappa, calibration, self-preference against the humans, and a reliability curve."""
    pairs = [orjson.loads(line) for line in (folder / "pairs.jsonl").read_bytes().splitlines()]
    humans = []
    for pair in pairs:
        label = 2 if len(pair["output_2"]) > len(pair["output_1"]) else 1
        humans += [{**pair, "preference": label}] * 3
    labels = write_jsonl(tmp_path / "humans.jsonl", humans)
    report, plot = tmp_path / "audit.md", tmp_path / "audit.png"
    result = run(
        folder,
        "longer",
        "--humans",
        labels,
        "--families",
        "m1=fam1,m2=fam2",
        "--judge-family",
        "fam1",
        "--report",
        str(report),
        "--plot",
        str(plot),
        resamples="30",  # the winning rate's interval reruns the test on each resample
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == report.read_text()
    lines = {line.split(" | ")[0].lstrip("| "): line for line in result.stdout.splitlines()}
    assert "| agreement | 1.000 [1.000, 1.000] | 200 |" in lines["agreement"]
    assert "| cohen_kappa | 1.000" in lines["cohen_kappa"]
    assert "| brier | 0.000" in lines["brier"] and "| ece | 0.000" in lines["ece"]
    assert "| self_preference | 0.000" in lines["self_preference"]
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_bad_checks_and_families_are_usage_errors(folder):
    result = run(folder, "first", "--fail-on", "flip_rate=0.2")
    assert result.exit_code == 2 and "expected FIGURE>VALUE" in result.output
    result = run(folder, "first", "--fail-on", "flips>0.2")
    assert result.exit_code == 2 and "no figure 'flips'" in result.output
    result = run(folder, "first", "--families", "m1")
    assert result.exit_code == 2 and "expected NAME=FAMILY" in result.output


# ---------------------------------------------------------------- AlpacaEval's evaluators' leaderboard


def published(judge: str) -> dict[str, float]:
    path = shared_data("alpaca_eval/leaderboards/evaluators/evaluators_leaderboard.csv")
    with open(path, newline="") as handle:
        row = next(r for r in csv.DictReader(handle) if r[""] == judge)
    return {key: float(value) for key, value in row.items() if key not in ("", "mode") and value}


def test_the_evaluators_leaderboard_longest_row_comes_out_the_same(tmp_path):
    """AlpacaEval's `longest` judge (output_1 when it is longer in characters, else output_2) on the
    648 cross-annotated pairs (the texts of the gpt4_b1 runs), audited through the file judge: P(prefers
    longer) and P(prefers lists) are the published ones exactly (1 and 98/111)."""
    source = shared_data("alpaca_eval/gpt4_b1_seeds/annotations_seed0.json")
    pairs = [
        {key: row[key] for key in ("instruction", "input", "output_1", "output_2")}
        for row in json.loads(source.read_text())
    ]
    for pair in pairs:
        pair["preference"] = 1 if len(pair["output_1"]) > len(pair["output_2"]) else 2
    labels = write_jsonl(tmp_path / "longest.jsonl", pairs)
    (tmp_path / "longest.yaml").write_text(
        f"name: longest\ndescription: AlpacaEval's longest\nflip_rate: 0.0\n"
        f"judges:\n  - {{name: longest, backend: file, path: {labels}}}\n"
    )
    result = RUNNER.invoke(
        cli,
        [labels, "--pool", str(tmp_path / "longest.yaml"), "--no-cache", "--format", "jsonl"]
        + ["--bootstrap", "20"],
    )
    found = figures(result)
    board = published("longest")
    assert found["p_prefers_longer"]["estimate"] == board["Proba. prefer longer"] == 1.0
    assert found["p_prefers_lists"]["estimate"] == pytest.approx(
        board["Proba. prefer lists"], abs=1e-12
    )
    assert found["p_prefers_lists"]["n"] == 111 and found["p_prefers_longer"]["n"] == 445


def test_the_longest_rows_variance_and_first_position_come_out_the_same():
    """The same judge in four runs, as the board asks each judge: variance 0 and P(prefers 1) =
    270/648, the published figures (farm-audit's own P(prefers first) shows each pair both ways)."""
    from farmkit.annotate.pairs import Item
    from farmkit.evaluate.audit import audit
    from farmkit.evaluate.correlate import alpaca_eval_preferences

    source = shared_data("alpaca_eval/gpt4_b1_seeds/annotations_seed0.json")
    items = [Item(row) for row in json.loads(source.read_text())]
    verdicts = [1.0 if len(i.output_1) > len(i.output_2) else 2.0 for i in items]
    run = [{"preference": p} for p in verdicts] + [{"preference": 3 - p} for p in verdicts]
    result = audit(items, [run] * 4, "longest", resamples=10)
    board = published("longest")
    assert result.estimate("variance") == board["Variance"] == 0.0
    assert result.estimate("p_prefers_first") == 0.5
    firsts = [
        c
        for *_, c in alpaca_eval_preferences(
            (i.output_1, i.output_2, p) for i, p in zip(items, verdicts, strict=True)
        )
    ]
    assert sum(firsts) / len(firsts) == pytest.approx(board["Proba. prefer 1"], abs=1e-12)


def test_an_endpoint_judge_through_the_cache_and_the_budget(folder, tmp_path, monkeypatch):
    """The fake endpoint's judge prefers the longer answer; the audit asks it every pair both ways
    once (a greedy judge: one run), a rerun is answered by the cache, and a budget below the expected
    price asks nothing."""
    from openai_server import OpenAIServer, judge_longer

    pairs = [orjson.loads(line) for line in (folder / "pairs.jsonl").read_bytes().splitlines()]
    few = write_jsonl(tmp_path / "few.jsonl", pairs[:20])
    cache = str(tmp_path / "verdicts.sqlite")
    with OpenAIServer(respond=judge_longer) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
        args = [few, "--pool", "single", "--format", "jsonl", "--bootstrap", "50"]
        first = RUNNER.invoke(cli, [*args, "--cache", cache])
        assert first.exit_code == 0, first.output
        assert figures(first)["p_prefers_longer"]["estimate"] == 1.0
        asked = len(server.bodies)
        assert asked == 40  # 20 pairs x 2 orders, one request each (batch size 1)
        again = RUNNER.invoke(cli, [*args, "--cache", cache])
        assert again.stdout == first.stdout and len(server.bodies) == asked
        broke = RUNNER.invoke(cli, [*args, "--no-cache", "--max-cost", "0.000001"])
        # the FarmError that the entry point prints as one line, exit 1
        assert broke.exit_code == 1 and "exceeds --max-cost" in str(broke.exception)
        assert len(server.bodies) == asked
        assert "sk-test-secret" not in first.output + str(broke.exception)


def test_a_pair_and_its_mirror_meet_the_same_judge_of_a_pool(folder, tmp_path):
    """A pool of two order-consistent judges that disagree (one prefers the longer output, the other
    the shorter): no verdict flips, since the pair and its mirror image go to the same judge."""
    (tmp_path / "two.yaml").write_text(
        "name: two\ndescription: two judges\nflip_rate: 0.0\njudges:\n"
        "  - {name: longer, backend: oracle, reward: heuristic, temperature: 0.0, length_bias: 100.0}\n"
        "  - {name: shorter, backend: oracle, reward: heuristic, temperature: 0.0, length_bias: -100.0}\n"
    )
    result = RUNNER.invoke(
        cli,
        [str(folder / "pairs.jsonl"), "--pool", str(tmp_path / "two.yaml"), "--no-cache"]
        + ["--format", "jsonl", "--bootstrap", "20"],
    )
    found = figures(result)
    assert found["flip_rate"]["estimate"] == 0.0
    assert 0.2 < found["p_prefers_longer"]["estimate"] < 0.8  # both judges were asked


def test_labels_of_screened_out_annotators_are_left_out_unless_asked(folder, tmp_path):
    """farm-label --min-check-score marks the labels of annotators who failed the checks
    screened_out: true; farm-audit --humans leaves them out (and says how many), as farm-winrate
    --humans and farm-correlate do, unless --include-screened."""
    lines = (folder / "pairs.jsonl").read_bytes().splitlines()[:20]  # 20 pairs: cheap
    pairs = write_jsonl(tmp_path / "pairs.jsonl", map(orjson.loads, lines))
    humans = []
    for pair in map(orjson.loads, lines):
        longer = 2 if len(pair["output_2"]) > len(pair["output_1"]) else 1
        humans.append({**pair, "preference": longer, "annotator": "careful"})
        humans.append({**pair, "preference": 3 - longer, "annotator": "b", "screened_out": True})
    labels = write_jsonl(tmp_path / "humans.jsonl", humans)

    def audit(*args):
        return RUNNER.invoke(
            cli,
            [pairs, "--pool", str(folder / "longer.yaml"), "--no-cache", "--bootstrap", "5"]
            + ["--format", "jsonl", *args],
        )

    result = audit("--humans", labels)
    assert result.exit_code == 0, result.output
    assert figures(result)["agreement"]["estimate"] == 1.0
    assert "farm-audit: 20 human labels of annotators screened out" in result.stderr
    result = audit("--humans", labels, "--include-screened")
    assert result.exit_code == 0, result.output
    assert figures(result)["agreement"]["estimate"] == 0.5  # one label each way: a tied mode
    assert "screened out" not in result.stderr
    result = audit("--include-screened")
    assert result.exit_code == 2 and "add --humans" in result.output
