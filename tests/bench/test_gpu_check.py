"""`make gpu-check DRY_RUN=1`: bench/gpu_check.py's every section (models built from configs with an
in-script tokenizer, farm-sample's engine batched and one prompt at a time, generation eager and
compiled beside the bandwidth bound, two farm-ppo and farm-grpo steps in three precisions and with
compiled rollouts, synchronous against --async-rollouts steps, the GRPO family's losses' first
step in bf16, farm-grpo against TRL's
GRPOTrainer, at two tiny shapes) on
the CPU, run the way make runs it on the GPU machine: the repository first on sys.path, the wheels
folder unpacked last (here a probe wheel, since .venv already holds click, orjson and trl). The
report's fields are checked, and the first-step KL is 0 where policy and reference compute alike."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.heavy

SHAPES = ("tiny-a", "tiny-b")
METHODS = ("ppo", "grpo")
PRECISIONS = ("fp32", "bf16-autocast", "bf16-weights")
PROBE = "farmkit_gpu_check_probe"


def _probe_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel, to see the script unpack and import what a wheel holds."""
    wheel = folder / f"{PROBE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{PROBE}/__init__.py", "LOADED = True\n")
        archive.writestr(
            f"{PROBE}-1.0.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n",
        )
    return wheel


def _make_gpu_check(folder: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path, float]:
    wheels = folder / "wheels"
    wheels.mkdir(exist_ok=True)
    _probe_wheel(wheels)
    report = folder / "gpu-check.json"
    started = time.monotonic()
    result = subprocess.run(
        [
            "make",
            "-C",
            str(ROOT),
            "gpu-check",
            "DRY_RUN=1",
            f"GPU_PYTHON={sys.executable}",
            f"GPU_WHEELS={wheels}",
            f"GPU_REPORT={report}",
            *extra,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=900,
    )
    return result, report, time.monotonic() - started


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[dict, str]:
    result, report, _ = _make_gpu_check(tmp_path_factory.mktemp("gpu-check"))
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    return json.loads(report.read_text()), result.stderr


def test_every_section_runs_and_the_report_says_so(dry_run):
    report, _ = dry_run
    assert report["schema"] == "farmkit-gpu-check/1"
    assert report["dry_run"] is True
    assert report["status"] == "complete"
    statuses = {section["name"]: section["status"] for section in report["sections"]}
    # the GPU run's 23, less what the dry run runs at the small shape only: the compile, the async
    # rollouts and 4 training runs (the same code paths at the large shape)
    assert len(statuses) == 17
    assert set(statuses.values()) == {"ok"}, statuses
    assert report["environment"]["device"] == "cpu"
    assert report["torch_threads"] == 1
    for shape in SHAPES:
        built = report["shapes"][shape]
        assert built["tokenizer_vocabulary"] == built["config"]["vocab_size"]
        assert built["parameters"] > 0
    assert report["shapes"]["tiny-b"]["stands_for"] == "llama-1b"


def test_sampling_reports_tokens_per_second_batched_and_one_at_a_time(dry_run):
    report, _ = dry_run
    for shape in SHAPES:
        sampling = report["sampling"][shape]
        assert sampling["dtype"] == "float32"  # farmkit's choice on a CPU
        batched, single = sampling["batched"], sampling["one_at_a_time"]
        assert batched["batch_size"] > 1 and single["batch_size"] == 1
        for figures in (batched, single):
            assert figures["records_written"] == figures["prompts"]
            assert (
                0 < figures["completion_tokens"] <= figures["prompts"] * figures["max_new_tokens"]
            )
            assert figures["generation_s"] > 0
            assert figures["tokens_per_s"] == pytest.approx(
                figures["completion_tokens"] / figures["generation_s"], rel=0.01
            )
            assert figures["tokens_per_s"] > 0
        assert sampling["batched_speedup"] == pytest.approx(
            batched["tokens_per_s"] / single["tokens_per_s"], rel=0.01
        )


def test_generation_eager_and_compiled_beside_the_bandwidth_bound(dry_run):
    report, _ = dry_run
    assert report["sizes"]["compiled_generation"] == report["sizes"]["sampling"]["batched"]
    # the dry run compiles at one shape (the GPU at both): the same code path, seconds a capture
    assert list(report["compiled_generation"]) == ["tiny-a"]
    for shape, compiled in report["compiled_generation"].items():
        assert compiled["compile_backend"] == "eager"  # the dry run's: no inductor on the CPU
        for label in ("eager", "compiled"):
            figures = compiled[label]
            assert 0 < figures["completion_tokens"] <= compiled["prompts"] * 8
            assert figures["tokens_per_s"] == pytest.approx(
                figures["completion_tokens"] / figures["generation_s"], rel=0.01
            )
            assert figures["fraction_of_bound"] is None
        assert compiled["compiled_speedup"] == pytest.approx(
            compiled["compiled"]["tokens_per_s"] / compiled["eager"]["tokens_per_s"], rel=0.01
        )
        bound = compiled["bandwidth_bound"]
        # float32 weights on the CPU: 4 bytes a parameter
        assert bound["parameter_bytes"] == 4 * report["shapes"][shape]["parameters"]
        assert bound["tokens_per_s"] is None and bound["device"] is None
        assert (
            bound["reason"] == "no peak figures for the CPU (cores, clocks and vector units vary)"
        )


def test_a_training_run_with_compiled_rollouts_beside_its_eager_twin(dry_run):
    report, _ = dry_run
    (shape,) = report["compiled_rollouts"]
    run = report["compiled_rollouts"][shape]
    assert (run["method"], run["precision"]) == ("grpo", "bf16-autocast")
    assert run["config"]["compile_generation"] is True
    assert [step["step"] for step in run["steps"]] == [1, 2]
    (eager,) = [
        other
        for other in report["training"]
        if (other["shape"], other["method"], other["precision"]) == (shape, "grpo", "bf16-autocast")
    ]
    assert eager["config"]["compile_generation"] is False
    assert run["eager_step2_s"] == eager["step2_s"]


def test_steps_per_hour_synchronous_and_with_async_rollouts(dry_run):
    report, _ = dry_run
    (shape,) = report["async_rollouts"]
    run = report["async_rollouts"][shape]
    assert shape == "tiny-a" and run["steps"] == 3
    assert run["sync"]["staleness"] == [None] * 3
    assert run["async"]["staleness"] == [0, 1, 1]
    for side in ("sync", "async"):
        later = run[side]["step_s"][1:]
        assert run[side]["steps_per_hour"] == pytest.approx(3600 * 2 / sum(later), rel=0.01)
    assert run["ratio_async_over_sync"] == pytest.approx(
        run["async"]["steps_per_hour"] / run["sync"]["steps_per_hour"], rel=0.01
    )


def test_farm_grpo_against_trls_grpo_trainer_per_step(dry_run):
    report, _ = dry_run
    trl = report["trl_grpo"]
    assert trl["shape"] == "tiny-b"  # stands for the 1.24B shape
    assert trl["settings"]["prompts_per_step"] * trl["settings"]["samples"] == 4
    for side in ("farmkit", "trl"):
        figures = trl[side]
        assert len(figures["step_seconds"]) == trl["settings"]["steps"]
        assert figures["seconds_per_step"] == pytest.approx(
            sorted(figures["step_seconds"])[len(figures["step_seconds"]) // 2]
            if len(figures["step_seconds"]) % 2
            else sum(figures["step_seconds"]) / 2,
            abs=0.002,
        )
        assert figures["tokens_per_step"] > 0
    assert trl["ratio_farmkit_over_trl"] == pytest.approx(
        trl["farmkit"]["seconds_per_step"] / trl["trl"]["seconds_per_step"], rel=0.01
    )
    assert trl["met"] is (trl["ratio_farmkit_over_trl"] <= 1.0)
    # the same settings on both sides, bf16 autocast over fp32 weights
    config = trl["trl"]["config"]
    assert (config["bf16"], config["use_cpu"], config["num_generations"]) == (True, True, 2)
    command = trl["farmkit"]["command"]
    assert command[command.index("--num-samples") + 1] == "2"
    assert trl["trl_version"] and trl["stand_ins"][0] == "datasets"


def test_the_new_losses_first_step_kl_is_exactly_zero_in_bf16(dry_run):
    from farmkit.train.estimators import POLICY_LOSSES

    report, _ = dry_run
    (losses,) = report["losses_first_step_kl"].values()
    registered = [name for name in ("dapo", "gspo", "cispo") if name in POLICY_LOSSES]
    assert [run["policy_loss"] for run in losses["runs"]] == ["seq-mean-token-mean", *registered]
    assert losses["not_registered"] == [n for n in ("dapo", "gspo", "cispo") if n not in registered]
    assert losses["precision"] == "bf16-weights"
    assert all(run["kl_step1"] == 0.0 and run["is_exactly_zero"] for run in losses["runs"])
    assert losses["all_exactly_zero"] is True


def test_each_training_run_reports_its_steps_memory_and_first_step_kl(dry_run):
    report, _ = dry_run
    runs = {(run["shape"], run["method"], run["precision"]): run for run in report["training"]}
    # every precision at the small shape; the large one in bf16 autocast only (the same code paths)
    assert sorted(runs) == sorted(
        [("tiny-a", m, p) for m in METHODS for p in PRECISIONS]
        + [("tiny-b", m, "bf16-autocast") for m in METHODS]
    )
    for (shape, method, precision), run in runs.items():
        assert shape in SHAPES and method in METHODS and precision in PRECISIONS
        assert [step["step"] for step in run["steps"]] == [1, 2]
        assert all(step["wall_s"] > 0 for step in run["steps"])
        # metrics.jsonl's throughput: tokens per second always, no MFU without a known peak
        assert all(step["tokens_per_s"] > 0 and step["mfu"] is None for step in run["steps"])
        assert run["step1_s"] == run["steps"][0]["wall_s"]
        assert run["step2_s"] == run["steps"][1]["wall_s"]
        assert run["run_wall_s"] >= run["step1_s"] + run["step2_s"]
        assert "peak_gpu_memory_gb" in run  # None on the CPU
        kl = run["kl_step1"]
        assert isinstance(kl, float) and math.isfinite(kl)
        assert run["kl_step1_is_exactly_zero"] is (kl == 0.0)
        # the precision really took effect: accelerate's mixed precision, the trained weights' dtype
        assert run["launch"]["mixed_precision"] == (
            "bf16" if precision == "bf16-autocast" else "no"
        )
        assert run["saved_policy_dtype"] == (
            "bfloat16" if precision == "bf16-weights" else "float32"
        )
        if precision in ("fp32", "bf16-weights"):
            # policy and reference are the same weights computed the same way: no KL before an update
            assert kl == 0.0, (shape, method, precision, kl)
    summary = {
        (row["shape"], row["method"], row["precision"]): row for row in report["first_step_kl"]
    }
    assert summary.keys() == runs.keys()
    for key, row in summary.items():
        assert row["kl_step1"] == runs[key]["kl_step1"]
        assert row["is_exactly_zero"] is runs[key]["kl_step1_is_exactly_zero"]


def test_the_wheels_go_last_on_sys_path_and_nothing_absent_on_the_gpu_is_imported(dry_run):
    report, _ = dry_run
    # farmkit as the GPU machine imports it: from the working tree, its subpackages kept in other
    # folders (schemas/, tools/) mapped as pyproject.toml says, an installed copy's finder unused
    assert report["environment"]["farmkit_path"] == str(ROOT / "farmkit")
    source = report["farmkit_source"]
    assert source["farmkit_path"] == str(ROOT / "farmkit")
    assert source["package_dirs"] == {
        "farmkit.tools": str(ROOT / "tools"),
        "farmkit.schemas": str(ROOT / "schemas"),
    }
    (probe,) = [wheel for wheel in report["wheels"] if wheel["wheel"].startswith(PROBE)]
    assert probe["modules"] == [PROBE]
    assert probe["used"] is True
    assert probe["imported_from"][PROBE].startswith(probe["site"])
    assert report["imported_but_absent_on_gpu"] == []


def test_progress_goes_to_stderr_with_timestamps(dry_run):
    _, stderr = dry_run
    lines = [line for line in stderr.splitlines() if line.startswith("[gpu-check ")]
    assert any("start sample tiny-a" in line for line in lines)
    assert any("start train tiny-b grpo bf16-autocast" in line for line in lines)
    assert any("farmkit / TRL seconds per step" in line for line in lines)
    assert "done: complete" in lines[-1]
    stamps = [float(line.split("+", 1)[1].split("s]", 1)[0]) for line in lines]
    assert stamps == sorted(stamps) and stamps[-1] > 0


def test_a_spent_budget_skips_the_sections_and_still_writes_the_report(tmp_path):
    result, report_path, _ = _make_gpu_check(tmp_path, "GPU_CHECK_ARGS=--budget-s 0")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["status"] == "partial"
    assert report["sections"] and {s["status"] for s in report["sections"]} == {
        "skipped (time budget)"
    }
    assert report["training"] == [] and report["sampling"] == {}


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tokenizer_has_exactly_the_models_vocabulary_and_a_chat_template():
    """Past 3 + 256 + 256^2 tokens (Llama-3.2-1B's 128,256) the merges are of three bytes."""
    module = _script()
    size = 3 + 256 + 256**2 + 1000
    tokenizer = module.build_tokenizer(size)
    assert len(tokenizer) == size
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (2, 2)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a colour, é."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    # every id decodes, the last (a three-byte merge) to three bytes' worth of text
    assert len(tokenizer.convert_ids_to_tokens(size - 1)) == 3
    assert tokenizer.decode(list(range(3, size, 997)))


def test_the_small_shape_is_the_embedded_models():
    """SHAPES['smollm2-135m'] copies the converted SmolLM2-135M-Instruct folder's config."""
    cache = Path(
        os.environ.get("FARMKIT_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "farmkit"
    )
    configs = sorted((cache / "models").glob("SmolLM2-135M-Instruct-*/config.json"))
    if not configs:
        pytest.skip(f"no converted embedded model under {cache / 'models'}")
    shape = _script().SHAPES["smollm2-135m"]
    config = json.loads(configs[0].read_text())
    theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    assert shape["rope_theta"] == theta
    assert shape["rms_norm_eps"] == pytest.approx(config["rms_norm_eps"], rel=1e-6)
    for key, value in shape.items():
        if key not in ("rope_theta", "rms_norm_eps"):
            assert config[key] == value, key
