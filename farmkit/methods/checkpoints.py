"""What an on-policy run (farm-ppo, farm-rloo, farm-grpo) writes beside its training and reads back
to resume: the checkpoint folder's metrics.jsonl (a line a step), a loadable policy folder every
--save-steps steps whose trainer/ subfolder holds what --resume needs (without DeepSpeed the
value model or the adapters, the optimizer and the scheduler; under DeepSpeed the engine's own
checkpoint beside the scheduler), and the output folder at the end."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError
from farmkit.evaluate.metrics import dumps as metrics_dumps
from farmkit.methods.config import config_dict

log = logging.getLogger("farmkit")
METRICS_FILE = "metrics.jsonl"
TRAINER_STATE = "trainer"
ENGINE_STATE = "engine"  # under DeepSpeed: the engine's own checkpoint, in the trainer state


def checkpoint_folder(output: str, config: Any) -> Path:
    """--checkpoint-dir, else OUTPUT-checkpoints beside the output."""
    chosen = getattr(config, "checkpoint_dir", None)
    return Path(chosen) if chosen else Path(f"{str(output).rstrip('/')}-checkpoints")


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest step-N folder that still holds a trainer state."""
    found = sorted(
        path for path in folder.glob("step-*") if (path / TRAINER_STATE / "state.json").is_file()
    )
    return found[-1] if found else None


def resume_point(output: str, config: Any) -> tuple[Path, Path | None, int, Path | None]:
    """(checkpoint folder, checkpoint resumed from or None, its step or 0, its trainer state or None)
    for a config with steps, checkpoint_dir, resume and lora (farm-ppo, farm-rloo, farm-grpo).

    LoRA trains adapters on the SFT weights, which stay the KL reference (adapters off), also on
    resume: the adapters are restored onto SFT, never added afresh to a merged checkpoint, so a run
    resumes the way it was started (with or without --lora)."""
    checkpoints = checkpoint_folder(output, config)
    resume_from = latest_checkpoint(checkpoints) if config.resume else None
    if config.resume and resume_from is None:
        raise FarmError(f"--resume: no checkpoint with a trainer state in {checkpoints}")
    start_step = (
        json.loads((resume_from / TRAINER_STATE / "state.json").read_text())["step"]
        if resume_from
        else 0
    )
    if start_step > config.steps:
        raise FarmError(
            f"--resume: {resume_from} is at step {start_step}, past --steps {config.steps}"
        )
    state = resume_from / TRAINER_STATE if resume_from else None
    if state is not None:
        written = json.loads((state / "state.json").read_text())
        # under DeepSpeed the engine's own checkpoint holds the adapters too
        lora = written.get("lora", (state / "policy-adapter").is_dir())
        if config.lora != lora:
            raise FarmError(
                f"--resume: {resume_from} was written by a run {'without' if config.lora else 'with'} --lora; resume it the same way"
            )
    return checkpoints, resume_from, start_step, state


def engine_state(state: Path | None, stage: int) -> Path | None:
    """The DeepSpeed engine's checkpoint in a trainer state (None without one), refusing a state of
    the other kind: a DeepSpeed run resumes only what a DeepSpeed run wrote, and the other way round
    (the engine splits the optimizer state its own way)."""
    if state is None:
        return None
    engine = state / ENGINE_STATE
    if bool(stage) != engine.is_dir():
        written_by, resumed_by = (
            ("a DeepSpeed launch", "without DeepSpeed")
            if engine.is_dir()
            else ("a run without DeepSpeed", "under DeepSpeed")
        )
        raise FarmError(
            f"--resume: {state.parent} was written by {written_by}; it cannot be resumed {resumed_by}"
        )
    return engine if stage else None


def load_trainer_state(
    state: Path | None, engine: Path | None, optimizer: Any, scheduler: Any
) -> None:
    """Put a checkpoint's optimizer and scheduler state back (without DeepSpeed; under DeepSpeed the
    engine restores its optimizer itself, load_engine_state, and the scheduler is farmkit's)."""
    import torch

    if state is None:
        return
    if engine is None:
        optimizer.load_state_dict(torch.load(state / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(state / "scheduler.pt", weights_only=True))


def load_engine_state(engine_model: Any, engine: Path | None) -> None:
    """Under DeepSpeed: the trained modules' weights and the engine's (split) optimizer state, as the
    checkpoint's engine saved them; every process loads its own part."""
    if engine is None:
        return
    loaded, _ = engine_model.load_checkpoint(
        str(engine), tag=ENGINE_STATE, load_module_strict=True, load_lr_scheduler_states=False
    )
    if loaded is None:
        raise FarmError(f"--resume: DeepSpeed could not load its checkpoint from {engine}")


class RunRecord:
    """What a policy-gradient run (farm-ppo, farm-rloo, farm-grpo) writes beside its training: the
    checkpoint folder's metrics.jsonl (a line a step, past a resumed step forgotten), a checkpoint
    every --save-steps steps, and the output folder at the end. Every process calls it; the
    main one writes."""

    def __init__(
        self,
        accelerator: Any,
        config: Any,
        checkpoints: Path,
        start_step: int,
        reward_model: str,
        meta_common: dict[str, Any],
    ) -> None:
        """meta_common: what every policy folder's meta.json of the run holds (policy_meta's tool,
        base_model, template, seed and inputs); the config and the launch are added here."""
        from farmkit.methods import launch
        from farmkit.methods.budget import Budget, reward_model_labels

        self.accelerator, self.config, self.checkpoints = accelerator, config, checkpoints
        self.meta_common = {
            **meta_common,
            "config": config_dict(config),
            "launch": launch.launch_record(accelerator),
        }
        self.metrics_path = checkpoints / METRICS_FILE
        # the metrics row of the step resumed from: its budget totals go on
        self.last: dict[str, Any] = (
            _last_metrics(self.metrics_path, start_step) if start_step else {}
        )
        self.budget = Budget(reward_model_labels(reward_model), self.last)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            checkpoints.mkdir(parents=True, exist_ok=True)
            _truncate_metrics(self.metrics_path, start_step)

    def meta(self, step: int, gold: Any) -> dict[str, Any]:
        from farmkit.methods.policy import policy_meta

        return policy_meta(**self.meta_common, step=step, **run_blocks(self.budget, gold))

    def end_step(
        self,
        row: dict[str, Any],
        message: str,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        tokenizer: Any,
        gold: Any,
    ) -> None:
        """Step `row["step"]` is done: its metrics line, its log line, the trackers, a checkpoint."""
        from farmkit.methods import tracking

        done = row["step"]
        if self.accelerator.is_main_process:
            with open(self.metrics_path, "a") as handle:
                handle.write(metrics_dumps(row))
            log.info(message)
        tracking.log(self.accelerator, row, done)
        if checkpoint_step(done, self.config) and done < self.config.steps:
            _write_checkpoint(
                self.accelerator,
                model,
                optimizer,
                scheduler,
                tokenizer,
                self.checkpoints / f"step-{done:06d}",
                self.meta(done, gold),
                done,
            )

    def save(self, model: Any, tokenizer: Any, output: str, gold: Any) -> None:
        """The trained policy as the output folder (gathered whole under ZeRO-3), with the metrics."""
        from farmkit.methods import launch, tracking
        from farmkit.methods.policy import save_policy

        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        with launch.full_weights(accelerator, model) as whole:
            if accelerator.is_main_process:
                save_policy(
                    whole.policy,
                    tokenizer,
                    output,
                    self.meta(self.config.steps, gold),
                    extra_files=[self.metrics_path],
                )
        tracking.finish(accelerator)
        accelerator.wait_for_everyone()


def linear_scheduler(optimizer: Any, config: Any, updates_per_step: int) -> Any:
    """Warm up for --warmup-steps, then decay linearly to 0 at the last step; stepped per update."""
    import torch

    from farmkit.methods import rl_common

    schedule = rl_common.linear_schedule(
        config.warmup_steps * updates_per_step, config.steps * updates_per_step
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def checkpoint_step(done: int, config: Any) -> bool:
    """Whether step `done` ends with a checkpoint (every --save-steps steps) or the run."""
    every = config.checkpoint_every
    return done == config.steps or bool(every and done % every == 0)


def run_blocks(budget: Any, gold: Any) -> dict[str, Any]:
    """meta.json's `budget` (and `gold`, with a gold judge) of a run so far."""
    return {"budget": budget.block(), "gold": gold.block() if gold is not None else None}


def _last_metrics(path: Path, step: int) -> dict[str, Any]:
    """The metrics of `step` as the interrupted run wrote them (a resumed run that has nothing left)."""
    entries = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )
    return next((entry for entry in reversed(entries) if entry["step"] == step), {})


def _truncate_metrics(path: Path, step: int) -> None:
    """Forget metrics past the step a run restarts from (they belong to the run that crashed)."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= step
    ]
    path.write_text("".join(line + "\n" for line in kept))


def _write_checkpoint(
    accelerator: Any,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    tokenizer: Any,
    folder: Path,
    meta: dict[str, Any],
    step: int,
) -> None:
    """A loadable policy folder; its trainer/ subfolder is what --resume reads, and is removed from
    the previous checkpoint to save disk. Without DeepSpeed it holds the value model (or the
    adapters), the optimizer and the scheduler, written with the folder. Under DeepSpeed it holds the
    engine's own checkpoint (trainer/engine/: the trained modules and the optimizer state split the
    engine's way, each process writing its part) beside the scheduler. Its state.json, written
    last, marks it whole."""
    import torch

    from farmkit.methods.launch import full_weights, zero_stage

    deepspeed = bool(zero_stage(accelerator))
    accelerator.wait_for_everyone()
    previous = latest_checkpoint(folder.parent)
    state = folder / TRAINER_STATE
    with full_weights(accelerator, model) as whole:
        lora = hasattr(whole.policy, "peft_config")
        if accelerator.is_main_process:
            _save_checkpoint(whole, None if deepspeed else optimizer, tokenizer, folder, meta)
    if deepspeed:
        accelerator.wait_for_everyone()
        model.save_checkpoint(str(state / ENGINE_STATE), tag=ENGINE_STATE)  # collective
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(scheduler.state_dict(), state / "scheduler.pt")
        (state / "state.json").write_text(json.dumps({"step": step, "lora": lora}) + "\n")
        if previous is not None and previous != folder:
            shutil.rmtree(previous / TRAINER_STATE, ignore_errors=True)
        log.info("checkpoint: %s", folder)
    accelerator.wait_for_everyone()


def _save_checkpoint(
    whole: Any, optimizer: Any, tokenizer: Any, folder: Path, meta: dict[str, Any]
) -> None:
    """The policy folder with an empty trainer/ subfolder, or without DeepSpeed (an `optimizer`) one
    that holds the value model (or the adapters) and the optimizer state."""
    import torch

    from farmkit.methods.policy import save_policy

    def trainer_state(tmp: Path) -> None:
        state = tmp / TRAINER_STATE
        state.mkdir(parents=True, exist_ok=True)
        if optimizer is None:  # DeepSpeed: the engine writes its own state in here
            return
        for name, unwrapped in (("policy", whole.policy), ("value", whole.value)):
            if unwrapped is None:  # a method without a value model (farm-rloo, farm-grpo)
                continue
            if hasattr(
                unwrapped, "peft_config"
            ):  # the adapters alone: resume puts them back on SFT / RM
                unwrapped.save_pretrained(state / f"{name}-adapter")
            elif name == "value":
                unwrapped.save_pretrained(state / "value")
                tokenizer.save_pretrained(state / "value")
        torch.save(optimizer.state_dict(), state / "optimizer.pt")

    save_policy(
        whole.policy,
        tokenizer,
        folder,
        meta,
        extra_files=[folder.parent / METRICS_FILE],
        extra=trainer_state,
    )


# ---------------------------------------------------------------------------------------------
# Resume states of the trainers whose checkpoints are not policy folders (farm-rm-train, farm-quark):
# step-N/trainer/ holds accelerate's own state of what was prepared or registered (weights,
# optimizer, scheduler, random states; split per process under DeepSpeed) and state.json (the step,
# the config, and what the run must carry on: its metrics rows so far). Only the newest is kept; the
# folder goes away when the run finishes.

# settings a resumed run may change: they do not alter what is computed
# (a preset's name changes nothing by itself: the values it resolved to are compared)
RESUMABLE_CHANGES = {"resume", "save_steps", "checkpoint_every", "device", "report_to", "preset"}


def resume_state(checkpoints: Path, config: Any) -> tuple[Path | None, dict[str, Any]]:
    """With --resume: the newest state in `checkpoints` and its state.json (an error when there is
    none, or when it was written under settings that change the result); else (None, {})."""
    if not config.resume:
        return None, {}
    found = latest_checkpoint(checkpoints)
    if found is None:
        raise FarmError(f"--resume: no checkpoint with a trainer state in {checkpoints}")
    written = json.loads((found / TRAINER_STATE / "state.json").read_text())
    check_same_settings(found, written["config"], config)
    log.info("resuming from %s (step %d)", found, written["step"])
    return found / TRAINER_STATE, written


def check_same_settings(found: Path, written: dict[str, Any], config: Any) -> None:
    """Refuse to resume a state written under settings that change the result."""
    now = json.loads(json.dumps(config_dict(config)))  # as JSON holds it (lists, not tuples)
    changed = sorted(
        key
        for key in set(now) | set(written)
        if key not in RESUMABLE_CHANGES and now.get(key) != written.get(key)
    )
    if changed:
        raise FarmError(
            f"--resume: {found} was written with other settings ({', '.join(changed)}); "
            "resume with the same ones"
        )


def newest_trainer_checkpoint(checkpoints: Path) -> Path | None:
    """The newest checkpoint-N folder a transformers Trainer wrote in `checkpoints`, or None."""
    steps = [path for path in checkpoints.glob("checkpoint-*") if path.name[11:].isdigit()]
    return max(steps, key=lambda path: int(path.name[11:]), default=None)


def trainer_checkpoint(checkpoints: Path, config: Any, main_process: bool = True) -> str | None:
    """For a transformers Trainer (farm-dpo): the newest checkpoint-N it wrote in `checkpoints` with
    --resume (an error when there is none, or when the run's settings were others), else None.
    Either way the folder records this run's settings (run.json) for the next --resume."""
    record = checkpoints / "run.json"
    found = None
    if config.resume:
        found = newest_trainer_checkpoint(checkpoints)
        if found is None or not record.is_file():
            raise FarmError(f"--resume: no checkpoint in {checkpoints}")
        check_same_settings(found, json.loads(record.read_text())["config"], config)
        log.info("resuming from %s", found)
    if main_process and config.save_steps:
        checkpoints.mkdir(parents=True, exist_ok=True)
        record.write_text(metrics_dumps({"config": config_dict(config)}))
    return str(found) if found else None


def save_resume_state(
    accelerator: Any, checkpoints: Path, step: int, config: Any, carried: dict[str, Any]
) -> None:
    """Write step-N/trainer/ (every process calls it: accelerate saves its share), state.json last,
    then remove the older state: a run killed while writing still has the previous one."""
    accelerator.wait_for_everyone()
    previous = latest_checkpoint(checkpoints)
    folder = checkpoints / f"step-{step:06d}"
    if accelerator.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(folder / TRAINER_STATE), safe_serialization=False)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"step": step, "config": config_dict(config), **carried}
        (folder / TRAINER_STATE / "state.json").write_text(metrics_dumps(state))
        if previous is not None and previous != folder:
            shutil.rmtree(previous, ignore_errors=True)
        log.info("checkpoint: %s", folder)
    accelerator.wait_for_everyone()


def saves_now(step: int, last: int, every: int) -> bool:
    """Whether step `step` ends with a resume state: every `every` steps, never at the last."""
    return bool(every) and step % every == 0 and step < last
