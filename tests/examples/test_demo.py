"""The laboratory end to end: examples/Makefile at SIZE=ci runs every step (split, SFT, pairs,
noisy annotation, reward model, the seven methods, evaluation with the simulated pool and the gold
annotator, leaderboards, correlation, plots) on the tiny model; a second make does nothing, and
re-annotating the same outputs is served from the cache. Then `make methods-at-equal-budget`
(examples/budget.mk) on the same run: PPO, RLOO, GRPO, DPO, online DPO and best-of-n from the demo's
SFT model and reward model, and GRPO scored by the pool itself, every one at the same N_PREF labels, each judged by the gold pool on the
val prompts. (The tiny model exercises the recipes, not the methods: `make demo` itself is the run on
the embedded model, and the README's table the equal-budget one.) The tests that run a recipe are
marked `recipe`; the size table's test only plans commands (`make -n`) and stays in make test-fast."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import orjson
import pytest
from conftest import ROOT, run_tool

EXAMPLES = ROOT / "examples"
# the file each system's outputs are in, and its name on the leaderboards (SIZE=ci: best of 2)
SYSTEMS = {
    "sft": "sft",
    "feedme": "feedme",
    "rc": "rc",
    "expiter": "expiter",
    "dpo": "dpo",
    "ppo": "ppo",
    "quark": "quark",
    "bon": "sft-best-of-2",
}
N_VAL = 6  # SIZE=ci's val split
N_PREF = 8  # SIZE=ci: the labels every method at an equal budget gets
# the equal-budget recipe's trained methods (budget.mk's EB_METHODS); best-of-n beside them
BUDGET_METHODS = ["ppo", "rloo", "grpo", "grpo-pool", "dpo", "odpo"]


def _make(*args: str, check: bool = True, timeout: float = 2400) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
    }
    # the recipe's farm-* commands start as forks of the test's fork server where that cannot
    # change what they do (tests/forkserver.py); VENV= keeps the shims first on PATH
    env["PATH"], venv = forkserver.recipe_path(env["PATH"])
    # one torch thread for every step: the suite's workers already fill the cores, and a step with
    # two threads beside them spends CPU time waiting for its second thread
    result = subprocess.run(
        ["make", "-C", str(EXAMPLES), *args, "HEAD_THREADS=1", *venv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if check:
        assert result.returncode == 0, (
            f"make {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        )
    return result


def _records(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _assert_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pixels = imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 0, f"{path} is blank"


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, tiny_model_path) -> tuple[list[str], Path]:
    out = tmp_path_factory.mktemp("demo-ci")
    # The evaluation pool is a local judge (the tiny model reading its answer log-probabilities):
    # oracle verdicts cost nothing and are never cached, a local judge's are.
    pool = out / "tiny_local.yaml"
    pool.write_text(
        "name: tiny_local\n"
        "description: the tiny test model as an in-process judge\n"
        "flip_rate: 0.0\n"
        f"judges:\n  - {{name: tiny-choice, backend: local, model: {tiny_model_path}, prompt: local_choice, temperature: 0.0}}\n"
    )
    variables = ["SIZE=ci", f"MODEL={tiny_model_path}", f"OUT={out}", f"EVAL_POOL={pool}"]
    result = _make("demo", *variables)
    (out / "stdout.txt").write_text(result.stdout)
    return variables, out


def _check_leaderboards(out: Path) -> None:
    for kind in ("sim", "gold"):
        rows = {row["generator"]: row for row in _records(out / f"leaderboard_{kind}.jsonl")}
        assert sorted(rows) == sorted(SYSTEMS.values()), kind
        for name, row in rows.items():
            assert 0 <= row["win_rate"] <= 100, (kind, name, row["win_rate"])
            assert row["n_total"] + row.get("n_dropped", 0) == N_VAL, (kind, name)
        _assert_png(out / f"leaderboard_{kind}.png")
    correlation = _records(out / "correlation.jsonl")
    assert correlation and correlation[0]["n"] == len(SYSTEMS)
    # undefined (null) only when one leaderboard is constant, which the tiny model can produce
    spearman = correlation[0]["spearman"]
    assert spearman is None or -1 <= spearman <= 1
    _assert_png(out / "sim_vs_gold.png")


@pytest.mark.recipe
def test_ci_pipeline_produces_both_leaderboards_correlation_and_plots(ci_run):
    _, out = ci_run
    _check_leaderboards(out)
    printed = (out / "stdout.txt").read_text()
    for name in SYSTEMS.values():
        assert f"\n{name} " in printed, f"{name} missing from the printed leaderboard"
    assert "Simulated vs gold leaderboard: n 8" in printed
    # beside the win rates: every system's surrogate reward on val, and the RL methods' training figures
    header, *rows = [
        line
        for line in printed.splitlines()
        if line.startswith(("system ", *(f"{n} " for n in SYSTEMS.values())))
    ]
    assert header.split()[-6:] == ["RM", "score", "train", "reward", "KL/token", "length"], header
    table = {row.split()[0]: row for row in rows}
    for file, name in SYSTEMS.items():
        scored = _records(out / "scores" / f"{file}.jsonl")
        assert len(scored) == N_VAL and {r["generator"] for r in scored} == {name}
        mean = sum(r["reward"] for r in scored) / N_VAL
        assert f"{mean:+.3f}" in table[name], (name, mean, table[name])
        length = sum(len(r["output"]) for r in scored) // N_VAL
        assert table[name].rstrip().endswith(f" {length}"), (name, length, table[name])
    for name in ("ppo", "quark"):  # one pass through the prompts at SIZE=ci: first and last step
        history = _records(out / "models" / name / "metrics.jsonl")
        first_last = f"{history[0]['reward']:+.3f} → {history[-1]['reward']:+.3f} (steps)"
        assert first_last in table[name], table[name]
    # KL per token: PPO logs its estimate summed over a response, Quark per token
    ppo, quark = (
        _records(out / "models" / name / "metrics.jsonl")[-1] for name in ("ppo", "quark")
    )
    assert f"{ppo['kl'] / ppo['response_length']:.4f}" in table["ppo"], table["ppo"]
    assert f"{quark['kl']:.4f}" in table["quark"], table["quark"]
    assert table["sft"].split()[-3:-1] == ["-", "-"], table["sft"]
    # and the reward model's held-out accuracy, as farm-rm-train measured it (SIZE=ci holds out one
    # prompt, whose pair may be a tie the reward model does not train or evaluate on)
    training = orjson.loads((out / "models" / "rm" / "meta.json").read_bytes())["training"]
    expected = (
        f"Reward model: held-out pairwise accuracy {training['eval_accuracy']:.3f} on "
        f"{training['eval_pairs']} pairs"
        if training.get("eval_pairs")
        else "none held out (no held-out accuracy)"
    )
    assert expected in printed, printed
    # the evaluation compares every system with the same reference outputs, on the val prompts
    reference = _records(out / "outputs" / "reference.jsonl")
    for kind in ("sim", "gold"):
        for file, name in SYSTEMS.items():
            verdicts = _records(out / "eval" / kind / f"{file}.jsonl")
            assert {v["generator_1"] for v in verdicts} == {"base"}
            assert {v["generator_2"] for v in verdicts} == {name}
            assert sorted(v["output_1"] for v in verdicts) == sorted(r["output"] for r in reference)


@pytest.mark.recipe
def test_second_make_does_nothing(ci_run):
    variables, _ = ci_run
    assert _make("-q", "results", *variables, check=False).returncode == 0, (
        "targets are not up to date"
    )
    planned = _make("-n", "results", *variables).stdout
    assert "farm-" not in planned, planned


@pytest.mark.recipe
def test_reannotation_is_served_from_the_cache(ci_run):
    variables, out = ci_run
    before = {path: path.read_bytes() for path in sorted((out / "eval").rglob("*.jsonl"))}
    # Pairs whose two outputs are identical are tied without asking (nothing to cache); re-annotate
    # the system whose answers differ most often from the reference, so the cache has work to serve.
    differing = {
        file: sum(
            r["output_1"] != r["output_2"] for r in _records(out / "eval" / "sim" / f"{file}.jsonl")
        )
        for file in SYSTEMS
    }
    file = max(differing, key=differing.get)
    assert differing[file] > 0, differing
    (out / "eval" / "sim" / f"{file}.jsonl").unlink()
    (out / "eval" / "gold" / f"{file}.jsonl").unlink()
    planned = _make("-n", "results", *variables).stdout
    commands = [line.split()[0] for line in planned.splitlines() if line.startswith("farm-")]
    # only the two annotations, the two leaderboards and the correlation are redone
    assert sorted(commands) == [
        "farm-annotate",
        "farm-annotate",
        "farm-correlate",
        "farm-winrate",
        "farm-winrate",
    ]
    command = [
        line
        for line in planned.splitlines()
        if line.startswith("farm-annotate") and "/sim/" in line
    ][0]
    # forked from the fork server (run_tool), as the recipe's own commands are
    rerun = run_tool(*command.replace(" -q", "").split())
    stderr = rerun.stderr.decode()
    assert rerun.returncode == 0, stderr
    assert (
        f"{N_VAL - differing[file]} identical pairs tied), 0 requests, {differing[file]} cache hits"
        in stderr
    ), stderr
    _make("results", *variables)
    after = {path: path.read_bytes() for path in sorted((out / "eval").rglob("*.jsonl"))}
    assert after == before
    _check_leaderboards(out)


@pytest.mark.recipe
def test_every_method_at_one_label_budget_is_judged_by_gold(ci_run):
    # on the demo's run: its split, SFT model, preferences and reward model are made once, and the
    # equal-budget methods start from them as budget.mk says they do
    variables, out = ci_run
    result = _make("methods-at-equal-budget", *variables)
    folder = out / "equal-budget"
    rows = {row["method"]: row for row in _records(folder / "budget.jsonl")}
    assert sorted(rows) == sorted([*BUDGET_METHODS, "bon (n=2)"])
    # `make methods-at-equal-budget` prints the table, one line per method
    table = (folder / "table.txt").read_text()
    assert table in result.stdout and len(table.splitlines()) == 1 + len(rows)
    for name, row in rows.items():
        assert row["labels"] == N_PREF, name  # the equal label budget
    assert rows["dpo"]["tokens sampled"] == 0  # DPO samples nothing to train
    assert all(rows[m]["tokens sampled"] > 0 for m in ("ppo", "rloo", "grpo", "grpo-pool", "odpo"))
    assert rows["bon (n=2)"]["KL"] == pytest.approx(math.log(2) - 0.5)
    for method in BUDGET_METHODS:
        meta = orjson.loads((folder / method / "meta.json").read_bytes())
        assert meta["budget"]["labels_used"] == N_PREF
        assert meta["gold"]["kind"] == "pool" and meta["gold"]["judge"] == "gold"
        assert meta["gold"]["prompts"] == N_VAL  # the val prompts, held out from training
        judged = [r for r in _records(folder / method / "metrics.jsonl") if "gold_win_rate" in r]
        assert len(judged) == {"dpo": 1, "odpo": 2}.get(method, 2)  # checkpoints, rounds, the end
        # the table's row is the method's last gold-judged checkpoint and its own budget
        assert rows[method]["gold win rate"] == judged[-1]["gold_win_rate"], method
        assert rows[method]["length"] == judged[-1]["gold_answer_length"], method
        assert rows[method]["wall s"] == meta["budget"]["wall_seconds"], method
        # the surrogate reward of its answers to the val prompts, scored by the reward model
        answers = _records(folder / "answers" / f"{method}.jsonl")
        assert len(answers) == N_VAL and all("reward" in a for a in answers)
    # GRPO from the pool: 4 steps of 2 groups of 2, one comparison a group; no reward model
    pooled = orjson.loads((folder / "grpo-pool" / "meta.json").read_bytes())
    assert pooled["config"]["pool"] == "sim_ann_offline" and pooled["step"] == 4
    assert [r["labels_used"] for r in _records(folder / "grpo-pool" / "metrics.jsonl")] == [
        2,
        4,
        6,
        8,
    ]
    online = orjson.loads((folder / "odpo" / "meta.json").read_bytes())["budget"]
    assert online["rounds"] == 2 and online["labels_used"] == N_PREF  # 2 rounds of 4 pairs
    bon = _records(folder / "bon" / "metrics.jsonl")
    assert [row["n"] for row in bon] == [1, 2] and all("gold_win_rate" in row for row in bon)
    assert rows["bon (n=2)"]["gold win rate"] == bon[-1]["gold_win_rate"]
    assert rows["bon (n=2)"]["length"] == bon[-1]["gold_answer_length"]
    _assert_png(folder / "budget.png")


@pytest.mark.parametrize("size,column", [("ci", 0), ("demo", 1), ("study", 2), ("full", 3)])
def test_the_size_presets_are_one_table(size, column, tmp_path):
    """examples/sizes.mk holds each size's settings once (a row per variable, a column per SIZE):
    the planned commands take their sizes from its rows, a command-line value wins over a row, and
    the full study's OO_N_* follow the demo's N_* when those are changed."""
    rows = {}
    for line in (EXAMPLES / "sizes.mk").read_text().splitlines():
        if ".sizes" in line and ":=" in line:
            name, values = line.split("#")[0].split(":=")
            rows[name.strip().removesuffix(".sizes")] = values.split()
    assert {"N_SFT", "SFT_STEPS", "PPO_STEPS", "OO_N_PREF", "OVEROPT_NS"} <= set(rows)
    assert all(len(values) == 4 for values in rows.values()), rows
    out = f"OUT={tmp_path}"
    planned = _make("-n", "demo", f"SIZE={size}", out).stdout
    assert f"--max-steps {rows['SFT_STEPS'][column]} " in planned
    assert f"--steps {rows['PPO_STEPS'][column]} " in planned
    assert f"sft={rows['N_SFT'][column]},pref={rows['N_PREF'][column]}," in planned
    overridden = _make("-n", "demo", f"SIZE={size}", "PPO_STEPS=7", out).stdout
    assert "--steps 7 " in overridden
    study = _make("-n", "overopt", f"SIZE={size}", "N_PREF=77", out).stdout
    expected = "77" if size == "full" else rows["OO_N_PREF"][column]
    assert (
        f"pref={expected}," in study and f"-n {rows['OVEROPT_NS'][column].split(',')[-1]} " in study
    )


def test_the_full_preset_gives_each_training_tool_a_launch_it_accepts_and_that_fits(tmp_path):
    """SIZE=full plans every training command under accelerate launch on GPUS GPUs with a shipped
    config the tool accepts (farm-quark refuses ZeRO-3) and that fits a 7B model on 80 GB cards by
    README's memory table: ZeRO-2, except farm-ppo under ZeRO-3 (ZeRO-2 holds ~80 GB per GPU there).
    One launch at a time (-j1); a tool's own *_LAUNCH on the command line wins."""
    import re

    import yaml

    out = f"OUT={tmp_path}"
    planned = _make("-n", "demo", "SIZE=full", out).stdout
    launches: dict[str, set[str]] = {}
    for line in planned.splitlines():
        found = re.search(r"-m farmkit\.tools\.(farm_\w+)", line)
        if found:
            config = re.search(r"--config_file (\S+) --num_processes 8 -m", line)
            assert config, line
            assert line.startswith("accelerate launch "), line
            launches.setdefault(found.group(1), set()).add(config.group(1))
    trainers = {"farm_sft", "farm_rm_train", "farm_dpo", "farm_expiter", "farm_ppo", "farm_quark"}
    assert set(launches) == trainers, launches
    for line in planned.splitlines():  # no training tool runs without its launcher
        assert not re.match(r"\s*farm-(sft|rm-train|dpo|expiter|ppo|quark) ", line), line
    stages = {}
    for tool, configs in launches.items():
        (config,) = configs
        settings = yaml.safe_load(Path(config).read_text())
        assert settings["distributed_type"] == "DEEPSPEED" and "num_processes" not in settings
        stages[tool] = settings["deepspeed_config"]["zero_stage"]
    assert stages == {**{tool: 2 for tool in trainers}, "farm_ppo": 3}
    assert "-j1 results" in planned
    fewer = _make("-n", "demo", "SIZE=full", "GPUS=4", out).stdout
    assert "--num_processes 4 -m farmkit.tools.farm_ppo" in fewer
    own = _make("-n", "demo", "SIZE=full", "QUARK_LAUNCH=torchrun --nproc_per_node 2", out).stdout
    assert "torchrun --nproc_per_node 2 -m farmkit.tools.farm_quark" in own
    study = _make("-n", "overopt", "SIZE=full", out).stdout
    assert re.search(r"accelerate_zero3\.yaml --num_processes 8 -m farmkit\.tools\.farm_ppo", study)
    # the CPU sizes launch nothing
    assert "accelerate launch" not in _make("-n", "demo", "SIZE=demo", out).stdout


def test_train_reward_compares_whole_passes_through_the_prompts(tmp_path, monkeypatch):
    """report.py's `train reward`: the mean of the first and of the last pass (steps per pass from
    the run's meta.json and its input file), the first and last step under two passes, and for
    expert iteration the first sample against the best of n."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.chdir(tmp_path)
    import report

    (tmp_path / "prompts.jsonl").write_text('{"instruction": "q"}\n' * 6)
    for config, per_pass in (
        ({"rollout_batch_size": 2}, 3),  # PPO: one response per prompt
        ({"rollout_batch_size": 4, "samples_per_prompt": 2}, 3),  # RLOO, GRPO: responses
        ({"prompts_per_round": 4}, 2),  # Quark, rounded up
    ):
        folder = tmp_path / str(per_pass) / str(len(config))
        folder.mkdir(parents=True)
        meta = {"config": config, "inputs": {"prompts.jsonl": "sha"}}
        (folder / "meta.json").write_text(orjson.dumps(meta).decode())
        assert report.steps_per_pass(folder) == per_pass, config
    rows = [{"reward": r} for r in (0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.9)]
    assert report.train_reward(rows, 3) == "+0.200 → +0.733"
    assert report.train_reward(rows, 4) == "+0.100 → +0.900 (steps)"
    assert report.train_reward(rows, None) == "+0.100 → +0.900 (steps)"
    last = {"reward": 0.3, "best_of_n_reward": 0.45, "n": 4}
    assert report.train_reward([*rows, last], 3) == "+0.300 → +0.450 (best of 4)"


def _assert_splits_are_full(split_command: str, records: list[dict]) -> None:
    """farm-split's stable mode gives each split an interval of [0, 1) in proportion to its size, so
    data barely larger than the sizes' total can leave a split short (a study drawn from 3,200
    instructions for 3,164 places got 199 evaluation prompts and 293 demonstrations): every split
    the recipe asks for must come out at its size."""
    from farmkit.core.split import assign, parse_sizes

    sizes_text = split_command.split("--sizes ")[1].split()[0]
    seed = int(split_command.split("--seed ")[1].split()[0])
    counts = assign(records, parse_sizes(sizes_text), seed=seed).counts
    wanted = {name: int(value) for name, value in (i.split("=") for i in sizes_text.split(","))}
    assert counts == wanted, (split_command, counts)


@pytest.mark.parametrize("size", ["ci", "demo"])
def test_the_shipped_instructions_fill_every_split_of_the_cpu_presets(size, tmp_path):
    planned = _make("-n", "demo", f"SIZE={size}", f"OUT={tmp_path}").stdout
    split = next(line for line in planned.splitlines() if line.startswith("farm-split "))
    assert split.split()[1] == "data/instructions.jsonl", split
    _assert_splits_are_full(split, _records(EXAMPLES / "data" / "instructions.jsonl"))


def test_the_study_is_the_demo_at_size_study_and_its_splits_fit_the_data(tmp_path, monkeypatch):
    """`make study` plans the demo at SIZE=study: >= 200 evaluation prompts, splits that its data can
    hold (the instruction generator's longer list, whose first 900 records are the shipped ones), and
    a report that tests each method against SFT (--evals)."""
    planned = _make("-n", "study", f"OUT={tmp_path}").stdout
    split = next(line for line in planned.splitlines() if line.startswith("farm-split "))
    sizes = dict(item.split("=") for item in split.split("--sizes ")[1].split()[0].split(","))
    assert int(sizes["val"]) >= 200, sizes
    data = split.split()[1]
    generator = next(line for line in planned.splitlines() if "make_instructions.py" in line)
    assert generator.endswith(f" -o {data}"), (generator, data)
    count = int(generator.split(" -n ")[1].split()[0])
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import make_instructions

    records = make_instructions.build(count, 0)
    assert len({(r["instruction"], r["input"]) for r in records}) == count
    shipped = _records(EXAMPLES / "data" / "instructions.jsonl")
    assert records[: len(shipped)] == shipped
    _assert_splits_are_full(split, records)
    assert (
        f"--evals {tmp_path}/eval --reference-scores {tmp_path}/scores/reference.jsonl" in planned
    )
