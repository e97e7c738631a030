"""farmkit.train.checkpoints: the one checkpoint rule of every trainer (a checkpoint is complete once
its state.json is written last; --resume takes the newest complete one, removes the incomplete ones,
and with none starts from the beginning and says so), checked by SIGKILLing each trainer at a seeded
random moment of its saves; and the guard that stops a diverging run before it saves anything."""

from __future__ import annotations

import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import forkserver
import pytest
from policy_fixtures import keyword_reward_model, prompt_records, write_jsonl

from farmkit.train import checkpoints as C

DEMOS = [
    {"instruction": "Name the colour of a clear daytime sky.", "output": "Blue."},
    {"instruction": "What is three plus four?", "output": "Seven."},
    {"instruction": "Name a colour.", "output": "Red."},
    {"instruction": "Say hello.", "output": "Hello."},
]
PREFS = [
    {
        "instruction": demo["instruction"],
        "output_1": demo["output"],
        "output_2": "No.",
        "preference": 1,
    }
    for demo in DEMOS
]
ENV = {"OMP_NUM_THREADS": "1"}  # what make test sets: the fork server serves the runs


def test_resume_takes_the_newest_complete_checkpoint_and_removes_the_incomplete(tmp_path, caplog):
    """A kill during the save of checkpoint-3 leaves it without state.json beside a complete
    checkpoint-2 (farm-dpo took checkpoint-3 and failed)."""
    for step, complete in ((2, True), (3, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        if complete:
            C.mark_complete(folder, {"step": step})
    with caplog.at_level(logging.INFO, logger="farmkit"):
        found = C.resume_from(tmp_path, resume=True)
    assert found == tmp_path / "checkpoint-2"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-2"]
    assert f"resuming from {found} (step 2)" in caplog.text


def test_resume_without_a_complete_checkpoint_starts_from_the_beginning(tmp_path, caplog):
    (tmp_path / "step-000001" / C.TRAINER_STATE).mkdir(parents=True)  # killed before state.json
    with caplog.at_level(logging.INFO, logger="farmkit"):
        assert C.resume_from(tmp_path, resume=True) is None
        assert C.resume_from(tmp_path / "never-made", resume=True) is None
    assert not (tmp_path / "step-000001").exists()
    assert f"no complete checkpoint in {tmp_path}: starting from the beginning" in caplog.text


def test_resume_keeps_the_older_policy_folders_of_an_on_policy_run(tmp_path):
    """farm-ppo's older step-N folders lose their resume state, not their policy: resume must not
    take them for checkpoints a kill left half-written."""
    for step in (1, 2, 3):
        (tmp_path / f"step-00000{step}" / C.TRAINER_STATE).mkdir(parents=True)
        (tmp_path / f"step-00000{step}" / "model.safetensors").write_text("")
    C.mark_complete(tmp_path / "step-000001", {"step": 1})
    C.mark_complete(tmp_path / "step-000002", {"step": 2})
    C.remove_older(tmp_path, tmp_path / "step-000002", keep_policies=True)
    (tmp_path / ".step-000004.partial").mkdir()  # killed while writing step 4's policy folder
    assert C.resume_from(tmp_path, resume=True) == tmp_path / "step-000002"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step-000001", "step-000002"]
    assert (tmp_path / "step-000001" / "model.safetensors").is_file()


def test_a_newer_checkpoint_replaces_the_older_only_once_complete(tmp_path):
    older, newer = tmp_path / "step-000001", tmp_path / "step-000002"
    for folder in (older, newer):
        (folder / C.TRAINER_STATE).mkdir(parents=True)
    C.mark_complete(older, {"step": 1})
    assert C.latest_checkpoint(tmp_path) == older  # step 2 is still being written
    C.mark_complete(newer, {"step": 2})
    C.remove_older(tmp_path, newer, keep_policies=True)
    assert C.latest_checkpoint(tmp_path) == newer
    assert older.is_dir() and not (older / C.TRAINER_STATE).exists()  # the policy folder stays


def test_the_guard_names_the_step_of_a_non_finite_loss_or_weight():
    import torch

    from farmkit.core.io import FarmError

    C.check_finite(3, torch.tensor(0.5), torch.nn.Linear(2, 2))
    with pytest.raises(
        FarmError, match=r"^step 3: the loss is not finite \(nan\); nothing was saved"
    ):
        C.check_finite(3, float("nan"))
    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight[0, 0] = float("inf")
    with pytest.raises(
        FarmError,
        match=r"^step 4: a weight is not finite or past 1e\+06 in size \(the largest is inf\); "
        "nothing was saved",
    ):
        C.check_finite(4, 0.1, layer)
    # half precision: finite weights whose sum passes 65504 are still finite
    wide = torch.nn.Linear(1000, 100).half()
    with torch.no_grad():
        wide.weight.fill_(1.0)
    C.check_finite(5, 0.1, wide)
    with torch.no_grad():
        wide.weight[7, 7] = float("nan")
    with pytest.raises(FarmError, match=r"^step 6: a weight is not finite"):
        C.check_finite(6, 0.1, wide)


def test_the_guard_stops_a_finite_but_absurd_weight():
    """One step at --learning-rate 1e30 leaves weights of 1e30: finite, and their sum too (issue
    44: the run saved them and exited 0; only a second step turned them into NaN)."""
    import torch

    from farmkit.core.io import FarmError

    layer = torch.nn.Linear(4, 4)
    with torch.no_grad():
        layer.weight.fill_(1e30)
        layer.weight[0] = -1e30  # the sum is finite, and no weight is NaN or infinite
    assert math.isfinite(float(layer.weight.sum()))
    with pytest.raises(FarmError, match=r"^step 1: a weight is not finite or past 1e\+06 in size"):
        C.check_finite(1, 0.5, layer)
    with torch.no_grad():
        layer.weight.fill_(-9.25)  # a trained model's largest weights pass
    C.check_finite(1, 0.5, layer)


# ---------------------------------------------------------------------------------------------
# Every trainer from its command line, on the tiny model: 3 steps, a checkpoint after each


@pytest.fixture(scope="module")
def inputs(tiny_model_path, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    return {
        "model": tiny_model_path,
        "rm": keyword_reward_model(tiny_model_path, folder / "rm"),
        "demos": write_jsonl(folder / "demos.jsonl", DEMOS),
        "prefs": write_jsonl(folder / "prefs.jsonl", PREFS),
        "prompts": write_jsonl(folder / "prompts.jsonl", prompt_records(8)),
    }


def command(trainer: str, inputs: dict[str, Path], output: Path, *extra: str) -> list[str]:
    """The trainer's command line for 3 steps (rounds for farm-quark and farm-expiter), a checkpoint
    after each but the last."""
    model, rm = str(inputs["model"]), str(inputs["rm"])
    steps = {
        "farm-sft": [model, str(inputs["demos"]), "--max-steps", "3", "--batch-size", "2"],
        "farm-dpo": [model, str(inputs["prefs"]), "--max-steps", "3", "--batch-size", "2"],
        "farm-rm-train": [model, str(inputs["prefs"]), "--max-steps", "3", "--batch-size", "2"],
        "farm-quark": [
            *(model, rm, str(inputs["prompts"])),
            *("--rounds", "3", "--prompts-per-round", "4", "--num-samples", "2"),
            *("--num-quantiles", "2", "--max-new-tokens", "3"),
        ],
        "farm-expiter": [
            *(model, rm, str(inputs["prompts"])),
            *("--rounds", "3", "-n", "2", "--max-new-tokens", "3"),
            *("--max-steps", "1", "--batch-size", "2"),
        ],
        **{
            group: [
                *(model, rm, str(inputs["prompts"])),
                *("--steps", "3", "--rollout-batch-size", "4", "--num-samples", "2"),
                *("--minibatch-size", "4", "--micro-batch-size", "4", "--max-new-tokens", "3"),
            ]
            for group in ("farm-rloo", "farm-grpo")
        },
        "farm-ppo": [
            *(model, rm, str(inputs["prompts"])),
            *("--steps", "3", "--rollout-batch-size", "4", "--minibatch-size", "4"),
            *("--micro-batch-size", "4", "--max-new-tokens", "3"),
        ],
    }[trainer]
    # farm-expiter's rounds are its checkpoints: every one but the last
    saves = [] if trainer == "farm-expiter" else ["--save-steps", "1"]
    return [trainer, *steps, "-o", str(output), *saves, "--seed", "0", "--device", "cpu", *extra]


def kill_at_file(
    argv: list[str],
    checkpoints: Path,
    k: int,
    after_complete: bool,
    complete: Callable[[Path], bool] = lambda folder: C.latest_checkpoint(folder) is not None,
) -> int:
    """Start the trainer and SIGKILL it once the k-th file (counting every file ever seen) has
    appeared under `checkpoints`, counting from the moment the first checkpoint is complete
    (after_complete) or from the start; its exit status (-9 when killed). The trainer is forked
    from the fork server where it can be (its own process and pid all the same: the kill is the
    kernel's SIGKILL of that process), else started afresh."""
    done, fired = threading.Event(), threading.Event()

    def watch(pid: int) -> None:
        seen: set[Path] = set()
        counting, needed = not after_complete, k
        while not done.is_set():
            if not counting and complete(checkpoints):
                counting = True
                seen = {path for path in checkpoints.rglob("*") if not path.is_dir()}
                needed += len(seen)
            if counting and checkpoints.is_dir():
                seen.update(path for path in checkpoints.rglob("*") if not path.is_dir())
            if counting and len(seen) >= needed:
                fired.set()
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.002)

    environment = {**os.environ, **ENV}
    tool = str(Path(sys.executable).parent / argv[0])
    fork = forkserver.server()
    watcher: threading.Thread | None = None

    def started(pid: int) -> None:
        nonlocal watcher
        watcher = threading.Thread(target=watch, args=(pid,), daemon=True)
        watcher.start()

    try:
        if fork is not None and fork.same_imports(environment):
            status = fork.run([tool, *argv[1:]], None, environment, 600, started).returncode
            # a child killed by a signal sends no status (the server says 128 + 15 then)
            return -signal.SIGKILL if fired.is_set() and status > 128 else status
        process = subprocess.Popen(
            [tool, *argv[1:]],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=environment,
        )
        started(process.pid)
        return process.wait()
    finally:
        done.set()
        if watcher is not None:
            watcher.join()


def finite_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    weights = {}
    for file in folder.glob("*.safetensors"):
        weights.update(load_file(file))
    assert weights, f"no weights in {folder}"
    import torch

    assert all(torch.isfinite(tensor).all() for tensor in weights.values())
    return weights


TRAINERS = ["farm-sft", "farm-dpo", "farm-rm-train", "farm-quark", "farm-expiter", "farm-ppo"]
# farm-rloo and farm-grpo share farm-ppo's loop and checkpoints (farmkit.train.onpolicy): the
# default lane kills farm-ppo, the slow lane all three
ON_POLICY = ["farm-rloo", "farm-grpo"]
KEEPS_POLICIES = {"farm-ppo", *ON_POLICY}
DETERMINISTIC = {
    *ON_POLICY,
    "farm-rm-train",
    "farm-quark",
    "farm-expiter",
    "farm-ppo",
}  # resumed weights equal an uninterrupted run's, bit for bit


def killed_and_resumed(
    trainer: str,
    inputs: dict[str, Path],
    tmp_path: Path,
    seed: int,
    after_complete: bool,
    run_farm,
    compare: bool = True,
) -> None:
    """Kill the trainer at a seeded random moment: from the first complete checkpoint to the middle
    of the next save (after_complete), or during the first save; rerun it with --resume. compare:
    a deterministic trainer's resumed weights must equal an unbroken run's (one more run). The
    killed run starts as a process of its own (the test SIGKILLs its pid); the resumed and the
    unbroken runs go through run_farm (forked from a process that imported torch already)."""

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        done = run_farm(*argv, env=ENV)
        done.stderr = done.stderr.decode()
        return done

    output = tmp_path / "out"
    checkpoints = Path(f"{output}-checkpoints")
    argv = command(trainer, inputs, output)
    k = random.Random(f"{trainer} {seed}").randint(0 if after_complete else 1, 3)
    status = kill_at_file(argv, checkpoints, k, after_complete)
    assert status == -signal.SIGKILL, f"{trainer} ended before file {k}"
    assert not output.exists()
    complete = C.latest_checkpoint(checkpoints)
    assert complete is not None or not after_complete
    resumed = run([*argv, "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    if complete is None:
        assert (
            f"no complete checkpoint in {checkpoints}: starting from the beginning"
            in resumed.stderr
        )
    else:
        step = C.step_of(complete)
        assert f"resuming from {complete} (step {step})" in resumed.stderr, resumed.stderr[-3000:]
    # removed with the finished run, but for the on-policy trainers' step-N policy folders
    assert checkpoints.exists() == (trainer in KEEPS_POLICIES)
    weights = finite_weights(output)
    if compare and trainer in DETERMINISTIC:
        whole = tmp_path / "whole"
        assert run(command(trainer, inputs, whole)).returncode == 0
        expected = finite_weights(whole)
        assert all((weights[name] == expected[name]).all() for name in expected)


# The default lane kills one trainer of each kind of checkpoint code (a Trainer's checkpoint-N marked
# by the callback: farm-dpo, as farm-sft; accelerate's state: farm-rm-train, as farm-quark; the
# on-policy loop: farm-ppo, as farm-rloo and farm-grpo; farm-expiter's rounds) and checks that the
# resumed run finishes from the checkpoint it names; the slow lane kills every trainer at more
# moments and compares the resumed weights with an unbroken run's.
FAMILIES = ["farm-dpo", "farm-rm-train", "farm-ppo", "farm-expiter"]


@pytest.mark.heavy
@pytest.mark.parametrize("trainer", FAMILIES)
def test_a_kill_during_a_save_resumes_from_a_complete_checkpoint(
    trainer, inputs, tmp_path, run_farm
):
    killed_and_resumed(trainer, inputs, tmp_path, 0, True, run_farm, compare=False)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("trainer", TRAINERS + ON_POLICY)
def test_kills_at_more_moments_of_the_saves(trainer, seed, inputs, tmp_path, run_farm):
    killed_and_resumed(trainer, inputs, tmp_path, seed, True, run_farm)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", TRAINERS + ON_POLICY)
def test_a_kill_during_the_first_save_starts_over(trainer, inputs, tmp_path, run_farm):
    killed_and_resumed(trainer, inputs, tmp_path, 0, False, run_farm)


def online_dpo_killed_and_rerun(
    inputs: dict[str, Path], tmp_path: Path, run_farm, seed: int, compare: bool
) -> None:
    """farm-online-dpo's rounds are its checkpoints (round_<r>/round.json written last, the same
    command rerun continues from the finished ones): killed at a seeded moment from its first
    finished round to the middle of the next, the rerun finishes from the finished rounds (compare:
    with the weights of an unbroken run)."""
    output = tmp_path / "out"
    rounds = Path(f"{output}-checkpoints")
    argv = [
        *("farm-online-dpo", str(inputs["model"]), str(inputs["prompts"]), "-o", str(output)),
        *("--rounds", "3", "--prompts-per-round", "4", "--max-new-tokens", "3"),
        *("--batch-size", "2", "--max-steps", "1", "--seed", "0", "--device", "cpu"),
        *("--cache", str(tmp_path / "verdicts.sqlite")),
    ]
    k = random.Random(f"farm-online-dpo {seed}").randint(0, 3)
    status = kill_at_file(
        argv, rounds, k, True, lambda folder: any(folder.glob("round_*/round.json"))
    )
    assert status == -signal.SIGKILL, f"farm-online-dpo ended before file {k}"
    assert not output.exists()
    rerun = run_farm(*argv, env=ENV)
    assert rerun.returncode == 0, rerun.stderr.decode()[-3000:]
    assert "round 1: finished before, taken as it is" in rerun.stderr.decode()
    weights = finite_weights(output)
    if not compare:
        return
    whole = tmp_path / "whole"
    argv[argv.index(str(output))] = str(whole)
    argv[argv.index(str(tmp_path / "verdicts.sqlite"))] = str(tmp_path / "whole.sqlite")
    assert run_farm(*argv, env=ENV).returncode == 0
    expected = finite_weights(whole)
    assert all((weights[name] == expected[name]).all() for name in expected)


@pytest.mark.heavy
def test_a_kill_during_an_online_dpo_round_reruns_from_the_finished_rounds(
    inputs, tmp_path, run_farm
):
    online_dpo_killed_and_rerun(inputs, tmp_path, run_farm, 0, compare=False)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_killed_online_dpo_run_reruns_into_the_unbroken_runs_policy(
    seed, inputs, tmp_path, run_farm
):
    online_dpo_killed_and_rerun(inputs, tmp_path, run_farm, seed, compare=True)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_a_diverging_run_stops_naming_the_step_and_saves_nothing(trainer, inputs, tmp_path):
    """A finite but absurd learning rate: the weights overflow within a few steps."""
    import importlib

    from click.testing import CliRunner

    cli = importlib.import_module(f"farmkit.tools.{trainer.replace('-', '_')}").cli
    output = tmp_path / "out"
    args = command(trainer, inputs, output, "--learning-rate", "1e30")[1:]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 1, done.output[-3000:]
    message = str(done.exception)  # the error handler's line on stderr, exit 1, no traceback
    # farm-expiter names the round (its checkpoints' unit) before the step of the round's SFT
    found = re.match(r"(round (\d+): )?step (\d+): (the loss|a weight) is not finite", message)
    assert found and "nothing was saved: lower --learning-rate" in message, done.output[-3000:]
    assert not output.exists()
    # a checkpoint written before the divergence holds finite weights; none from its step on
    complete = C.latest_checkpoint(Path(f"{output}-checkpoints"))
    assert complete is None or C.step_of(complete) < int(found.group(2) or found.group(3))


@pytest.mark.parametrize("trainer", ["farm-sft", "farm-dpo", "farm-rm-train"])
def test_one_step_at_an_absurd_learning_rate_saves_nothing(trainer, inputs, tmp_path, run_farm):
    """farm-sft and farm-dpo saved a model of weights near 1e30 and exited 0 (issue 44)."""
    output = tmp_path / "out"
    argv = command(trainer, inputs, output, "--learning-rate", "1e30", "--max-steps", "1")
    done = run_farm(*argv)
    err = done.stderr.decode()
    assert done.returncode == 1, err[-3000:]
    assert f"{trainer}: error: step 1: a weight is not finite or past 1e+06 in size" in err
    assert "nothing was saved: lower --learning-rate" in err
    assert not output.exists() and C.latest_checkpoint(Path(f"{output}-checkpoints")) is None
