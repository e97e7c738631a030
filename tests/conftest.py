"""Shared fixtures: paths to the real public data, the embedded model, and a tiny random model that
shares the embedded tokenizer (for tests that train and need speed more than quality)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest

from farmkit.core.allocator import keep_freed_memory

# what every tool does when it starts (farmkit/core/allocator.py), done here too for the tests that
# train by calling the library in the pytest process itself
keep_freed_memory()

# The trainers' --precision auto picks bf16 autocast on a CPU with native bf16 (farmkit.train.precision):
# the suite's exact figures (TRL parity, resume equals unbroken, the mutation gate's) are fp32's, on
# every machine. Set before any tool runs, so run_tool's processes inherit it; tests/train/
# test_precision.py checks bf16 itself. FARMKIT_PRECISION=bf16 in the environment runs the suite so.
os.environ.setdefault("FARMKIT_PRECISION", "fp32")

ROOT = Path(__file__).resolve().parent.parent
# tests/ mirrors the package (tests/core/, tests/methods/, ...). A few test modules import helpers from
# a test module in another folder (test_reward's keyword world, test_cli's scalar tags): every folder
# is importable by its modules' names, whichever file pytest is asked to run
for _folder in sorted(Path(__file__).resolve().parent.iterdir()):
    if (
        _folder.is_dir()
        and _folder.name not in ("data", "__pycache__")
        and str(_folder) not in sys.path
    ):
        sys.path.append(str(_folder))
SHARED_DATA = Path(os.environ.get("FARMKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))


def shared_data(relative: str) -> Path:
    """A file under ../shared/data, or skip the test when it is absent."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"shared data not present: {path}")
    return path


def run_tool(
    *args: str, input: bytes | None = None, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run a farm-* console script in a real subprocess (bytes in, bytes out). The process is forked
    from one that imported torch and transformers already, where that cannot change what the tool
    does (tests/forkserver.py says when); otherwise it starts fresh."""
    tool, *rest = args
    argv = [str(Path(sys.executable).parent / tool), *rest]
    environment = {**os.environ, **(env or {})}
    fork = forkserver.server()
    if fork is not None and fork.same_imports(environment):
        return fork.run(argv, input, environment, timeout)
    return subprocess.run(argv, input=input, capture_output=True, timeout=timeout, env=environment)


DEEPSPEED_NOTICE = b"Setting accelerator to CPU"


def assert_no_stdout_from_the_tool(
    done: subprocess.CompletedProcess, deepspeed_launcher: bool
) -> None:
    """A tool that writes to -o prints nothing on stdout. Under `accelerate launch --use_deepspeed`
    the launcher itself (not the tool) imports DeepSpeed and prints its one-line `[WARNING]
    [real_accelerator.py...] Setting accelerator to CPU` notice on its own stdout before it starts the
    tool: that line alone is allowed, and the tool's own copy of the notice must be on stderr."""
    if not deepspeed_launcher:
        assert done.stdout == b"", done.stdout[:2000]
        return
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and DEEPSPEED_NOTICE in lines[0], done.stdout[:2000]
    assert DEEPSPEED_NOTICE in done.stderr  # the tool's own notice, routed away from its stdout


@pytest.fixture(name="run_farm")
def run_farm_fixture():
    """`run_tool`, for tests that take it as a fixture."""
    return run_tool


@pytest.fixture(scope="session")
def embedded_path() -> Path:
    """The embedded model as a cached HF folder (converted from the GGUF on first use)."""
    from farmkit.lm.models import resolve

    return Path(resolve("embedded"))


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, embedded_path) -> Path:
    """A 2-layer, 64-wide Llama with the embedded tokenizer and chat template, randomly initialised
    (seeded). Trains in seconds on a CPU; use it where the test is about the algorithm, not the model."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(embedded_path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


MODEL_FIXTURES = {"embedded_path", "tiny_model_path"}


# seconds each file's tests took (their --durations summed) in a clean clone's `make test` under three
# workers (2026-12-07, issue 43), for the order above; the recipes' files go first whatever they say
LONGEST_FILES = {
    "test_demo.py": 132,
    "test_ppo.py": 100,
    "test_quark.py": 45,
    "test_checkpoints.py": 78,
    "test_openai_backend.py": 68,
    "test_config.py": 63,
    "test_online_dpo.py": 60,
    "test_overopt.py": 53,
    "test_onpolicy.py": 47,
    "test_group.py": 45,
    "test_gpu_check.py": 43,
    "test_distributed.py": 40,
    "test_gold.py": 34,
    "test_endpoint.py": 33,
    "test_nightly.py": 32,
    "test_contract.py": 32,
    "test_cli.py": 24,
    "test_learned.py": 22,
    "test_online_dpo_continuity.py": 20,
    "test_forkserver.py": 20,
    "test_sft.py": 19,
    "test_formats_datasets.py": 18,
    "test_engine.py": 17,
    "test_dpo.py": 14,
    "test_bon.py": 12,
    "test_winrate.py": 12,
    "test_tracking.py": 11,
    "test_evaluate_run.py": 11,
    "test_group_pool.py": 11,
    "test_generation.py": 11,
    "test_humans.py": 10,
    "test_sampling.py": 10,
    "test_label_tool.py": 10,
    "test_schedule.py": 10,
    "test_batch_faults.py": 9,
    "test_expiter.py": 9,
    "test_reward.py": 9,
    "test_models_prompt_format.py": 8,
}


def pytest_collection_modifyitems(config, items):
    """Mark tests that load a model (through a model fixture) as `model`, so `make test-fast` (unit and
    contract tests, the edit loop) can leave them out."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
    # Under `make test`'s workers (pytest-xdist, a file per worker) the files that run a whole recipe
    # go first: started last, one of them alone keeps one worker busy minutes after the other is
    # done. The order within a file stays as written.
    if not (getattr(config.option, "numprocesses", None) or os.environ.get("PYTEST_XDIST_WORKER")):
        return
    # Then the longest files (measured, `make test PYTEST_ARGS=--durations=0`), longest first, so
    # that the last files to start are short ones and both workers end together; the rest as written.
    recipe = {item.path for item in items if item.get_closest_marker("recipe")}
    items.sort(
        key=lambda item: (
            item.path not in recipe,
            -LONGEST_FILES.get(item.path.name, 0),
        )
    )


@pytest.fixture(name="figures")
def figures_fixture(monkeypatch):
    """The figures the code saves, kept for inspection (each is still written to its file)."""
    drawn = []
    from farmkit.evaluate import plots

    save = plots._save

    def keep(figure, path, *args, **kwargs):
        drawn.append(figure)
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(plots, "_save", keep)
    return drawn


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps one process-wide state; a test that changes the launch's precision needs its
    own, and leaves none behind."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(autouse=True)
def farmkit_logger_restored():
    """A command run in-process (CliRunner) sets up the `farmkit` logger for a terminal: its own
    stderr handler, propagation off. Left so, a later test's caplog, which listens at the root,
    hears nothing from farmkit, and whether it passes depends on the order the tests ran in. Each
    test starts and ends with the logger as it was when the session began: a module-scoped fixture
    that ran a command is set up before this fixture, so what was there before the test is no
    baseline."""
    log = logging.getLogger("farmkit")
    _set_logger(log, _LOGGER_AT_START)
    yield
    _set_logger(log, _LOGGER_AT_START)


def _logger_state(log: logging.Logger) -> tuple:
    return (log.handlers[:], log.level, log.propagate, log.disabled)


def _set_logger(log: logging.Logger, state: tuple) -> None:
    log.handlers[:] = state[0]
    log.level, log.propagate, log.disabled = state[1], state[2], state[3]


_LOGGER_AT_START = _logger_state(logging.getLogger("farmkit"))
