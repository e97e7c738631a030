"""The one checkpoint rule of every trainer, and what an on-policy run (farm-ppo, farm-rloo,
farm-grpo) writes beside its training and reads back to resume.

The rule: checkpoints live in OUTPUT-checkpoints/ (or --checkpoint-dir), one folder a save named by
its step (step-N/ for farmkit's own loops, checkpoint-N/ where a transformers Trainer writes it). A
checkpoint is complete once its state.json is written, last, after everything else; --resume takes
the newest complete one and removes the incomplete ones (a kill during a save), and with none starts
from the beginning and says so. An older checkpoint's resume state is removed only after the newer
one is complete, so a kill at any moment leaves one to resume from.

An on-policy run's checkpoint folder holds metrics.jsonl (a line a step) and a loadable policy folder
every --save-steps steps whose trainer/ subfolder holds what --resume needs (without DeepSpeed the
value model or the adapters, the optimizer and the scheduler; under DeepSpeed the engine's own
checkpoint beside the scheduler)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from farmkit.core.io import FarmError
from farmkit.core.runs import METRICS_FILE
from farmkit.train.config import config_dict, shared_field
from farmkit.train.metrics import dumps as metrics_dumps

log = logging.getLogger("farmkit")
TRAINER_STATE = "trainer"
ENGINE_STATE = "engine"  # under DeepSpeed: the engine's own checkpoint, in the trainer state
STATE_FILE = "state.json"  # written last: the checkpoint is complete


def save_steps_field(steps: str = "Optimizer steps") -> Any:
    """The --save-steps field of a method whose checkpoints go to DIR-checkpoints/ (none by default);
    `steps` says what a step is for the method."""
    return shared_field(
        "save_steps",
        0,
        more_help=f"{steps}; checkpoints go to DIR-checkpoints/ (removed when the run ends).",
    )


def resume_field() -> Any:
    """The --resume field of a method whose checkpoints go to DIR-checkpoints/."""
    return shared_field(
        "resume",
        False,
        more_help="From the newest complete checkpoint in DIR-checkpoints/; "
        "with none (killed before its first save), the run starts from the beginning.",
    )


def checkpoint_folder(output: str, config: Any) -> Path:
    """--checkpoint-dir, else OUTPUT-checkpoints beside the output."""
    chosen = getattr(config, "checkpoint_dir", None)
    return Path(chosen) if chosen else Path(f"{str(output).rstrip('/')}-checkpoints")


def step_of(checkpoint: Path) -> int | None:
    """The step a checkpoint folder is named after (step-N, or a Trainer's checkpoint-N), else None."""
    prefix, _, number = checkpoint.name.rpartition("-")
    return int(number) if prefix in ("step", "checkpoint") and number.isdigit() else None


def state_file(checkpoint: Path) -> Path:
    """The file written last into a checkpoint, marking it complete: trainer/state.json in farmkit's
    own step-N folders (whose top level is a policy folder), state.json in a Trainer's checkpoint-N."""
    if checkpoint.name.startswith("step-"):
        return checkpoint / TRAINER_STATE / STATE_FILE
    return checkpoint / STATE_FILE


def _checkpoints(folder: Path) -> list[Path]:
    """Every checkpoint folder in `folder`, complete or not, oldest first."""
    found = [
        path
        for path in (folder.iterdir() if folder.is_dir() else ())
        if path.is_dir() and step_of(path) is not None
    ]
    return sorted(found, key=step_of)


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint in `folder` (its state.json written), or None."""
    complete = [path for path in _checkpoints(folder) if state_file(path).is_file()]
    return complete[-1] if complete else None


def remove_incomplete(folder: Path) -> None:
    """Remove the checkpoints a kill left half-written: those after the newest complete one (older
    ones without state.json are farm-ppo's policy folders whose resume state went once a newer
    checkpoint was complete), and the partial folder of a policy being written when it struck."""
    newest = latest_checkpoint(folder)
    for path in _checkpoints(folder):
        if newest is None or step_of(path) > step_of(newest):
            shutil.rmtree(path, ignore_errors=True)
    for partial in folder.glob(".step-*.partial"):
        shutil.rmtree(partial, ignore_errors=True)


def remove_older(folder: Path, newest: Path, keep_policies: bool = False) -> None:
    """Once `newest` is complete: remove the checkpoints before it (with keep_policies, only their
    trainer/ resume state: farm-ppo's step-N policy folders stay loadable for --gold and users)."""
    for path in _checkpoints(folder):
        if step_of(path) < step_of(newest):
            shutil.rmtree(path / TRAINER_STATE if keep_policies else path, ignore_errors=True)


def resume_from(checkpoints: Path, resume: bool, main_process: bool = True) -> Path | None:
    """With --resume: the newest complete checkpoint in `checkpoints` (the main process removes the
    incomplete ones), or None with a warning that the run starts from the beginning (a job on a
    preemptible machine passes --resume before it has ever saved). Without --resume: None."""
    if not resume:
        return None
    found = latest_checkpoint(checkpoints)
    if main_process:
        remove_incomplete(checkpoints)
    if found is None:
        log.warning("no complete checkpoint in %s: starting from the beginning", checkpoints)
    else:
        log.info("resuming from %s (step %d)", found, step_of(found))
    return found


def resume_point(output: str, config: Any) -> tuple[Path, Path | None, int, Path | None]:
    """(checkpoint folder, checkpoint resumed from or None, its step or 0, its trainer state or None)
    for a config with steps, checkpoint_dir, resume and lora (farm-ppo, farm-rloo, farm-grpo).

    LoRA trains adapters on the SFT weights, which stay the KL reference (adapters off), also on
    resume: the adapters are restored onto SFT, never added afresh to a merged checkpoint, so a run
    resumes the way it was started (with or without --lora)."""
    from farmkit.core import distributed

    checkpoints = checkpoint_folder(output, config)
    found = resume_from(checkpoints, config.resume, distributed.is_main())
    start_step = json.loads(state_file(found).read_text())["step"] if found else 0
    if start_step > config.steps:
        raise FarmError(f"--resume: {found} is at step {start_step}, past --steps {config.steps}")
    state = found / TRAINER_STATE if found else None
    if state is not None:
        written = json.loads(state_file(found).read_text())
        # under DeepSpeed the engine's own checkpoint holds the adapters too
        lora = written.get("lora", (state / "policy-adapter").is_dir())
        if config.lora != lora:
            raise FarmError(
                f"--resume: {found} was written by a run {'without' if config.lora else 'with'} --lora; resume it the same way"
            )
    return checkpoints, found, start_step, state


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
        reward_model: Any,
        meta_common: dict[str, Any],
    ) -> None:
        """meta_common: what every policy folder's meta.json of the run holds (policy_meta's tool,
        base_model, template, seed and inputs); the config and the launch are added here."""
        from farmkit.train import launch
        from farmkit.train.budget import Budget, reward_model_labels

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
        # a judge of pairs (--pool) has its labels counted as the run asks them (Budget.labelled)
        labels = (
            reward_model_labels(reward_model)
            if isinstance(reward_model, str | os.PathLike)
            else int(self.last.get("labels_used") or 0)
        )
        self.budget = Budget(labels, self.last)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            checkpoints.mkdir(parents=True, exist_ok=True)
            _truncate_metrics(self.metrics_path, start_step)

    def meta(self, step: int, gold: Any) -> dict[str, Any]:
        from farmkit.train.policy import policy_meta

        return policy_meta(**self.meta_common, step=step, **run_blocks(self.budget, gold))

    def log_step(self, row: dict[str, Any], message: str) -> None:
        """Step `row["step"]` is done: its metrics line, its log line, the trackers."""
        from farmkit.train import tracking

        if self.accelerator.is_main_process:
            with open(self.metrics_path, "a") as handle:
                handle.write(metrics_dumps(row))
            log.info(message)
        tracking.log(self.accelerator, row, row["step"])

    def checkpoint(
        self,
        done: int,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        tokenizer: Any,
        gold: Any,
        extra: Any = None,
    ) -> None:
        """After step `done`: a checkpoint every --save-steps steps (the last step's is the output).
        `extra(state)`: what every process adds to its trainer/ folder (the batches sampled ahead,
        farmkit.train.async_rollouts)."""
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
                extra,
            )

    def save(
        self, model: Any, tokenizer: Any, output: str, gold: Any, step: int | None = None
    ) -> None:
        """The trained policy as the output folder (gathered whole under ZeRO-3), with the metrics;
        `step`: the steps done, when the run stopped before --steps."""
        from farmkit.train import launch, tracking
        from farmkit.train.policy import save_policy

        accelerator = self.accelerator
        accelerator.wait_for_everyone()
        with launch.full_weights(accelerator, model) as whole:
            if accelerator.is_main_process:
                save_policy(
                    whole.policy,
                    tokenizer,
                    output,
                    self.meta(self.config.steps if step is None else step, gold),
                    extra_files=[self.metrics_path],
                )
        tracking.finish(accelerator)
        accelerator.wait_for_everyone()


def linear_scheduler(optimizer: Any, config: Any, updates_per_step: int) -> Any:
    """Warm up for --warmup-steps, then decay linearly to 0 at the last step; stepped per update."""
    import torch

    from farmkit.train import rl_common

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
    extra: Any = None,
) -> None:
    """A loadable policy folder; its trainer/ subfolder is what --resume reads, and is removed from
    the previous checkpoint to save disk. Without DeepSpeed it holds the value model (or the
    adapters), the optimizer and the scheduler, written with the folder. Under DeepSpeed it holds the
    engine's own checkpoint (trainer/engine/: the trained modules and the optimizer state split the
    engine's way, each process writing its part) beside the scheduler. Its state.json, written
    last, marks it whole."""
    import torch

    from farmkit.train.launch import full_weights, zero_stage

    deepspeed = bool(zero_stage(accelerator))
    accelerator.wait_for_everyone()
    state = folder / TRAINER_STATE
    with full_weights(accelerator, model) as whole:
        lora = hasattr(whole.policy, "peft_config")
        if accelerator.is_main_process:
            _save_checkpoint(whole, None if deepspeed else optimizer, tokenizer, folder, meta)
    if deepspeed:
        accelerator.wait_for_everyone()
        model.save_checkpoint(str(state / ENGINE_STATE), tag=ENGINE_STATE)  # collective
    accelerator.wait_for_everyone()
    if extra is not None:  # every process its own, before the folder is marked whole
        extra(state)
        accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(scheduler.state_dict(), state / "scheduler.pt")
        mark_complete(folder, {"step": step, "lora": lora})
        remove_older(folder.parent, folder, keep_policies=True)
    accelerator.wait_for_everyone()


def _save_checkpoint(
    whole: Any, optimizer: Any, tokenizer: Any, folder: Path, meta: dict[str, Any]
) -> None:
    """The policy folder with an empty trainer/ subfolder, or without DeepSpeed (an `optimizer`) one
    that holds the value model (or the adapters) and the optimizer state."""
    import torch

    from farmkit.train.policy import save_policy

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
    """With --resume and a complete checkpoint: its trainer state and state.json (an error when it
    was written under settings that change the result); else (None, {})."""
    from farmkit.core import distributed

    found = resume_from(checkpoints, config.resume, distributed.is_main())
    if found is None:
        return None, {}
    written = json.loads(state_file(found).read_text())
    check_same_settings(found, written["config"], config)
    return found / TRAINER_STATE, written


def check_same_settings(found: Path, written: dict[str, Any], config: Any) -> None:
    """Refuse to resume a state written under settings that change the result (`config`: a method's
    config, or the settings a run records as a dict)."""
    settings = config if isinstance(config, dict) else config_dict(config)
    now = json.loads(json.dumps(settings))  # as JSON holds it (lists, not tuples)
    # an option added since the checkpoint was written (an older farmkit's) ran as its default
    defaults = {} if isinstance(config, dict) else _defaults(config)
    changed = sorted(
        key
        for key in set(now) | set(written)
        if key not in RESUMABLE_CHANGES
        and now.get(key) != written.get(key)
        and not (key not in written and key in defaults and now.get(key) == defaults[key])
    )
    if changed:
        raise FarmError(
            f"--resume: {found} was written with other settings ({', '.join(changed)}); "
            "resume with the same ones"
        )


def _defaults(config: Any) -> dict[str, Any]:
    """A method config's fields at their defaults, as JSON holds them."""
    import dataclasses

    found = {}
    for field in dataclasses.fields(config):
        if field.default is not dataclasses.MISSING:
            found[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            found[field.name] = field.default_factory()
    return json.loads(json.dumps(found, default=str))


def mark_complete(checkpoint: Path, state: dict[str, Any]) -> None:
    """Write the checkpoint's state.json, after everything else in it: from now on it is complete.
    Written whole or not at all (a rename), so a kill never leaves a marker that cannot be read."""
    from farmkit.core.io import atomic_path

    with atomic_path(state_file(checkpoint)) as path:
        Path(path).write_text(metrics_dumps(state))
    log.info("checkpoint: %s", checkpoint)


def trainer_checkpoint(checkpoints: Path, config: Any, main_process: bool = True) -> str | None:
    """For a transformers Trainer (farm-sft, farm-dpo): with --resume, the newest complete
    checkpoint-N in `checkpoints` (an error when the run's settings were others), else None."""
    found = resume_from(checkpoints, config.resume, main_process)
    if found is None:
        return None
    check_same_settings(found, json.loads(state_file(found).read_text())["config"], config)
    return str(found)


def checkpoint_rule(config: Any) -> Any:
    """A TrainerCallback that applies the rule to a Trainer's checkpoint-N: on_save runs once the
    Trainer has written everything, and only then state.json marks the checkpoint complete and the
    older ones go. The Trainer's own rotation (save_total_limit) must stay off: it deletes the old
    checkpoint before the new one could be marked."""
    from transformers import TrainerCallback

    class CheckpointRule(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            from farmkit.core import distributed

            distributed.barrier()  # every process has written its share (DeepSpeed's shards)
            if state.is_world_process_zero:
                folder = Path(args.output_dir)
                saved = folder / f"checkpoint-{state.global_step}"
                mark_complete(saved, {"step": state.global_step, "config": config_dict(config)})
                remove_older(folder, saved)
            distributed.barrier()

    return CheckpointRule()


def save_resume_state(
    accelerator: Any, checkpoints: Path, step: int, config: Any, carried: dict[str, Any]
) -> None:
    """Write step-N/trainer/ (every process calls it: accelerate saves its share), state.json last,
    then remove the older state: a run killed while writing still has the previous one."""
    accelerator.wait_for_everyone()
    folder = checkpoints / f"step-{step:06d}"
    if accelerator.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(folder / TRAINER_STATE), safe_serialization=False)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        mark_complete(folder, {"step": step, "config": config_dict(config), **carried})
        remove_older(checkpoints, folder)
    accelerator.wait_for_everyone()


def saves_now(step: int, last: int, every: int) -> bool:
    """Whether step `step` ends with a resume state: every `every` steps, never at the last."""
    return bool(every) and step % every == 0 and step < last


# ---------------------------------------------------------------------------------------------
# The non-finite guard: a run that diverges stops at the step it did, before anything is saved (a
# model of NaN weights cannot be used, and a checkpoint of them would resume into NaN).


WEIGHT_LIMIT = 1e6
"""The largest trainable weight a run may reach: a trained language model's are below 100 (the
embedded model's largest is 9.25), and one step at an absurd learning rate (1e30) leaves weights of
that size, still finite, that the next step turns into NaN."""


def check_finite(step: int, loss: Any = None, model: Any = None) -> None:
    """Raise FarmError naming `step` when `loss` (a number or a tensor) is not finite, or when any
    trainable weight of `model` is not finite or past WEIGHT_LIMIT in size: the first step of a run
    at an absurd learning rate, before its weights overflow."""
    import math

    import torch

    if loss is not None:
        value = float(loss.detach().float().mean()) if torch.is_tensor(loss) else float(loss)
        if not math.isfinite(value):
            raise FarmError(
                f"step {step}: the loss is not finite ({value}); nothing was saved: lower "
                "--learning-rate (or check the data)"
            )
    if model is not None:
        trained = [param for param in model.parameters() if param.requires_grad and param.numel()]
        # The smallest and largest weight of each tensor, in one pass that writes no mask (about
        # as fast as a sum, where isfinite().all() took 20 times longer on the embedded model), then
        # one device sync for the whole model: NaN when any weight is NaN, inf when one is.
        largest = (
            torch.stack([torch.stack(torch.aminmax(param.detach())).float() for param in trained])
            .abs()
            .max()
            if trained
            else None
        )
        if largest is not None and not float(largest) <= WEIGHT_LIMIT:
            raise FarmError(
                f"step {step}: a weight is not finite or past {WEIGHT_LIMIT:g} in size (the "
                f"largest is {float(largest):g}); nothing was saved: lower --learning-rate (or "
                "check the data)"
            )


def finite_guard() -> Any:
    """A TrainerCallback that applies check_finite to a Trainer's run: the weights after every
    optimizer step and each logged loss, both before the step's save."""
    from transformers import TrainerCallback

    class FiniteGuard(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            check_finite(state.global_step, model=kwargs.get("model"))

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            check_finite(state.global_step, loss=(logs or {}).get("loss"))

    return FiniteGuard()
