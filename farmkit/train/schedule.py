"""Learning-rate warm-up and the logging cadence, one home for the trainers that take a warm-up ratio
(farm-sft and farm-expiter's rounds, farm-dpo and farm-online-dpo's rounds, farm-rm-train).

transformers' schedules warm up as step / warmup from step 0, so the first optimizer step runs at a
learning rate of 0; with a warm-up ratio of 0.03 (SFT's default) a run of up to 33 steps rounds the
warm-up to one whole step, and a 1-step run trains nothing. Here step k of a warm-up of W steps runs
at k / W of the rate (the first one included, the last at the full rate), and the steps after the
warm-up follow transformers' schedule unchanged. (The on-policy trainers' own schedule,
rl_common.linear_schedule, counts the same way.)

torch and transformers are imported inside the functions, so that `--help` stays fast."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def warmup_steps(ratio: float, total: int) -> int:
    """Warm-up steps for a ratio of `total` steps: transformers' count (rounded up), without the
    float noise that made 0.03 x 100 four steps."""
    return math.ceil(round(ratio * total, 9)) if ratio > 0 else 0


def warm_from_the_first_step(factor: Callable[[int], float], warmup: int) -> Callable[[int], float]:
    """A LambdaLR factor whose linear warm-up (done / warmup, transformers' for every schedule that
    has one) is moved one step earlier: (done + 1) / warmup; the steps after it are unchanged."""

    def shifted(done: int) -> float:
        return (done + 1) / warmup if done < warmup else factor(done)

    return shifted


def scheduler(
    name: str,
    optimizer: Any,
    warmup: int,
    total: int,
    options: dict[str, Any] | None = None,
) -> Any:
    """transformers' scheduler `name` (linear, cosine, constant_with_warmup, ...) over `total` steps
    with `warmup` steps of warm-up, each warm-up step at a non-zero rate."""
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import get_scheduler

    base = get_scheduler(
        name,
        optimizer=optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total,
        scheduler_specific_kwargs=options or {},
    )
    if warmup <= 0 or not isinstance(base, LambdaLR) or base.lr_lambdas[0](0) > 0:
        return base  # no warm-up in effect (e.g. "constant" ignores it): nothing to move
    # a second LambdaLR on the same optimizer starts again from each group's initial_lr
    return LambdaLR(optimizer, [warm_from_the_first_step(f, warmup) for f in base.lr_lambdas])


def learning_rates(name: str, warmup: int, total: int) -> list[float]:
    """The factor of the learning rate at each of `total` steps (for tests and the README)."""
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = scheduler(name, optimizer, warmup, total)
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def warm_trainer(trainer_class: type) -> type:
    """A transformers Trainer subclass whose scheduler warms up from the first step (see above);
    TrainingArguments' warmup_steps below 1 is a ratio of the run, as in transformers."""

    class WarmFromTheFirstStep(trainer_class):  # type: ignore[valid-type,misc]
        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                given = float(self.args.warmup_steps or 0)
                warmup = int(given) if given >= 1 else warmup_steps(given, num_training_steps)
                self.lr_scheduler = scheduler(
                    self.args.lr_scheduler_type,
                    optimizer if optimizer is not None else self.optimizer,
                    warmup,
                    num_training_steps,
                    self.args.lr_scheduler_kwargs,
                )
                self._created_lr_scheduler = True
            return self.lr_scheduler

    WarmFromTheFirstStep.__name__ = WarmFromTheFirstStep.__qualname__ = trainer_class.__name__
    return WarmFromTheFirstStep


def logging_steps(configured: int, total: int) -> int:
    """Log every `configured` steps, or more often in a short run: at least about ten rows (every
    step of a run under 20 steps)."""
    return max(1, min(configured, total // 10))


def step_logging_callback(configured: int) -> Any:
    """A TrainerCallback that logs every logging_steps(configured, the run's steps) steps, and the
    last step too (a 25-step run logging every 2 steps ends with step 25, not 24)."""
    from transformers import TrainerCallback

    class StepLogging(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            state.logging_steps = logging_steps(configured, state.max_steps)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.max_steps and state.global_step >= state.max_steps:
                control.should_log = True

    return StepLogging()
