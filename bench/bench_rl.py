"""Seconds per step and tokens generated per second of farm-grpo and farm-rloo against TRL's
GRPOTrainer and RLOOTrainer, same model, prompts and settings, on the CPU, in one run (target:
farmkit at least as fast per step, ratio farmkit / TRL <= 1).

Set-up, the same on both sides (every value is printed and written to the JSON result):
- policy and KL reference: the embedded model (SmolLM2-135M-Instruct, fp32) from
  farmkit.lm.models.resolve; reward model: the same body with a fresh one-label score head (seeded),
  saved once as a farmkit reward-model folder that both tools load (TRL through
  AutoModelForSequenceClassification, its own path for a reward model given as a folder);
- prompts: `prompts-per-step x steps` instructions ("Write a paragraph about ..."), each used
  once, formatted by the model's chat template (farmkit's PromptFormat; TRL applies the same
  template to conversational prompts: the token ids are checked equal);
- each step samples `samples` responses to each of `prompts-per-step` prompts (temperature 1, no
  top-k / top-p, up to `max-new-tokens`), scores them, and takes one optimizer step over them
  (minibatch = rollout batch, `micro-batch` responses per forward/backward, one epoch: farmkit's
  --ppo-epochs 1, TRL's num_iterations 1; TRL: per_device_train_batch_size = micro-batch,
  gradient_accumulation_steps = minibatch / micro-batch, generation_batch_size = rollout batch);
- GRPO: KL coefficient 0.04 in the loss (k3 estimator), per-response length-averaged token loss,
  advantages divided by the group's std (farmkit's defaults; TRL: beta=0.04, loss_type="grpo",
  scale_rewards="group", use_bias_correction_kl=False); RLOO: KL coefficient 0.05 subtracted from
  the reward (k1, summed over the response), leave-one-out baseline, sequence-level ratio
  (farmkit's defaults; TRL's: beta=0.05, normalize_advantages=False). Both load the reference
  model (beta > 0); clip 0.2, learning rate 1e-5 linear to 0, AdamW eps 1e-5, weight decay 0.01,
  gradient norm 1, dropout off, fp32, no gradient checkpointing, no checkpoints written.

Each tool runs in its own process, one after the other, alternating which goes first (grpo:
farmkit first; rloo: TRL first; `--rounds 2` repeats with the order swapped). What is timed: the
wall time between the ends of consecutive steps, after `warmup` steps, so the import, the model
loading and the first step's one-time costs are left out: farmkit's own per-step metrics.jsonl
`elapsed_s` (written at the end of each step, after its optimizer step), and TRL's `on_step_end`
callback (after the optimizer step, before its logging). The interval thus holds one rollout
(generation, reward, the reference and old log-probabilities), the update, and the previous
step's logging, on both sides. The same moments are read on the process's CPU clock too: each
process runs one torch thread (`--threads`), so on a loaded machine its wall time is mostly its
share of the cores, and the CPU seconds per step are the load-proof comparison (the wall ratio
of one GRPO pair moved from 0.79 to 1.46 between two runs here, the CPU ratio by 0.02).
Generated tokens are counted the same way in both processes: the completion tokens `generate`
returned for each row, up to and including its first end token. The time each phase takes
(generate, reward model, log-probabilities without gradient of the policy and of the reference,
training forward, backward, the rest), on both clocks, is measured by wrapping the same
functions in both processes, for the profile printed with the table (bench/README.md reads it).

    python bench/bench_rl.py                      # grpo and rloo, 4 x 4 samples, 32 tokens, 1 + 3 steps
    python bench/bench_rl.py --methods grpo --steps 5 --rounds 2

Prints a table on stderr and one JSON line per figure on stdout (bench/run.py's format); the whole
result (settings of both sides, per-step times, phases) goes to bench/out/bench_rl.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOPICS = [
    "the moon",
    "bread",
    "rivers",
    "chess",
    "volcanoes",
    "bees",
    "trains",
    "the ocean",
    "libraries",
    "tea",
    "glaciers",
    "bicycles",
    "owls",
    "clocks",
    "deserts",
    "music",
]
TOOLS = ("farmkit", "trl")
PHASES = (
    "generate",
    "reward",
    "policy_logprobs_nograd",
    "reference_logprobs",
    "train_forward",
    "backward",
)


@dataclasses.dataclass
class Settings:
    """One benchmark's settings; farmkit_args and trl_config turn them into each tool's."""

    prompts_per_step: int = 4
    samples: int = 4  # responses per prompt: the group
    max_new_tokens: int = 32
    warmup: int = 1  # steps run first and left out of the timing
    steps: int = 3  # timed steps
    micro_batch: int = 4  # responses per forward/backward pass
    minibatch: int = 0  # responses per optimizer step; 0: the whole rollout batch
    epochs: int = 1  # passes over each rollout batch
    temperature: float = 1.0
    learning_rate: float = 1e-5
    clip: float = 0.2
    grpo_kl: float = 0.04
    rloo_kl: float = 0.05
    adam_eps: float = 1e-5
    weight_decay: float = 0.01  # torch.optim.AdamW's default, which farmkit uses
    max_grad_norm: float = 1.0
    seed: int = 0
    # torch threads in each process (0: torch's default, one per core). One by default: on this
    # shared 2-core machine two threads per process spin against the other jobs' (a training
    # forward and backward took 22-26 s with two against 5-6 s with one, load average 9)
    threads: int = 1

    @property
    def rollout(self) -> int:
        return self.prompts_per_step * self.samples

    @property
    def minibatch_size(self) -> int:
        return self.minibatch or self.rollout

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def updates_per_step(self) -> int:
        return self.epochs * (self.rollout // self.minibatch_size)

    def check(self) -> None:
        if self.samples < 2 or self.steps < 1 or self.warmup < 1:
            # a timed step runs from the end of the step before it: at least one untimed step first
            raise SystemExit("--samples must be >= 2, --steps >= 1, --warmup >= 1")
        if self.rollout % self.minibatch_size or self.minibatch_size % self.micro_batch:
            raise SystemExit(
                "the rollout batch (prompts-per-step x samples) must be a multiple of the minibatch, "
                "and the minibatch a multiple of --micro-batch"
            )


def kl_coef(method: str, settings: Settings) -> float:
    return settings.grpo_kl if method == "grpo" else settings.rloo_kl


def farmkit_args(
    method: str, settings: Settings, policy: str, reward_model: str, prompts: str, output: str
) -> list[str]:
    """farm-grpo / farm-rloo's command line for these settings (without the program name)."""
    args = [
        policy,
        reward_model,
        prompts,
        "-o",
        output,
        "--checkpoint-dir",
        output + "-checkpoints",
        "--save-steps",
        "0",
        "--steps",
        str(settings.total_steps),
        "--rollout-batch-size",
        str(settings.rollout),
        "--num-samples",
        str(settings.samples),
        "--minibatch-size",
        str(settings.minibatch_size),
        "--micro-batch-size",
        str(settings.micro_batch),
        "--ppo-epochs",
        str(settings.epochs),
        "--learning-rate",
        str(settings.learning_rate),
        "--kl-coef",
        str(kl_coef(method, settings)),
        "--clip-range",
        str(settings.clip),
        "--temperature",
        str(settings.temperature),
        "--max-new-tokens",
        str(settings.max_new_tokens),
        "--reward-batch-size",
        str(settings.rollout),  # TRL scores the whole generation batch in one pass
        "--adam-eps",
        str(settings.adam_eps),
        "--max-grad-norm",
        str(settings.max_grad_norm),
        "--seed",
        str(settings.seed),
    ]
    if method == "grpo":  # farm-grpo's defaults, spelled out
        args += ["--kl-in", "loss", "--kl-estimator", "k3", "--no-dr-grpo"]
    else:
        args += ["--kl-in", "reward", "--kl-estimator", "k1"]
    return args


def trl_config(method: str, settings: Settings, output_dir: str) -> dict[str, Any]:
    """Keyword arguments of TRL's GRPOConfig / RLOOConfig for these settings."""
    config: dict[str, Any] = dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        disable_dropout=True,
        max_steps=settings.total_steps * settings.updates_per_step,
        per_device_train_batch_size=settings.micro_batch,
        gradient_accumulation_steps=settings.minibatch_size // settings.micro_batch,
        generation_batch_size=settings.rollout,
        num_generations=settings.samples,
        num_iterations=settings.epochs,
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=settings.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=0,
        adam_epsilon=settings.adam_eps,
        weight_decay=settings.weight_decay,
        max_grad_norm=settings.max_grad_norm,
        beta=kl_coef(method, settings),
        epsilon=settings.clip,
        seed=settings.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if method == "grpo":
        config.update(loss_type="grpo", scale_rewards="group", use_bias_correction_kl=False)
    else:
        config.update(normalize_advantages=False)
    return config


def prompt_records(count: int) -> list[dict[str, str]]:
    return [
        {"instruction": f"Write a paragraph about {TOPICS[i % len(TOPICS)]}.", "input": ""}
        for i in range(count)
    ]


def build_reward_model(base: str, folder: Path, seed: int) -> Path:
    """The base model's body with a fresh one-label score head (seeded), as a farmkit reward-model
    folder (weights, tokenizer, meta.json): what both tools score with."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from farmkit.lm.models import load_tokenizer, write_meta

    torch.manual_seed(seed)
    tokenizer = load_tokenizer(base, padding_side="right")
    network = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=1, dtype=torch.float32
    )
    network.config.pad_token_id = tokenizer.pad_token_id
    network.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_meta(
        folder,
        {
            "tool": "bench_rl",
            "kind": "reward_model",
            "base_model": str(base),
            "prompt_template": "chat",
            "seed": seed,
            "config": {"score_head": "fresh (untrained)"},
        },
    )
    return folder


# ---------------------------------------------------------------------------------------------
# Inside each tool's process: the same probes on both sides


class Probe:
    """Per-rollout phase times (wall and this process's CPU time) and generated tokens, from
    wrappers around the functions both processes call, and the clocks at each step's end. A
    rollout begins at each `generate` call; later phases count towards it."""

    def __init__(self, eos_id: int, patch: Any = setattr) -> None:
        self.eos_id = eos_id
        self.patch = patch  # setattr, or a test's monkeypatch.setattr (undone after it)
        self.started = time.perf_counter()
        self.rollouts: list[dict[str, Any]] = []
        self.before: dict[str, float] = {}  # phases before the first rollout (none expected)
        self.step_ends: list[float] = []  # wall, seconds since the probe started
        self.step_ends_cpu: list[float] = []  # CPU seconds of this process

    def step_end(self) -> None:
        self.step_ends.append(time.perf_counter() - self.started)
        self.step_ends_cpu.append(time.process_time())

    def add(self, phase: str, seconds: float, cpu: float) -> None:
        rollout = self.rollouts[-1] if self.rollouts else {"phases": self.before, "cpu": {}}
        rollout["phases"][phase] = rollout["phases"].get(phase, 0.0) + seconds
        rollout["cpu"][phase] = rollout["cpu"].get(phase, 0.0) + cpu

    def timed(self, phase: Any, function: Any) -> Any:
        """`function` wrapped to add its time to `phase` (a name, or a function of the call's
        arguments that returns one)."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            begin, begin_cpu = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                name = phase(*args, **kwargs) if callable(phase) else phase
                self.add(name, time.perf_counter() - begin, time.process_time() - begin_cpu)

        return wrapper

    def install_generate(self) -> None:
        import torch
        from transformers.generation.utils import GenerationMixin

        original = GenerationMixin.generate
        probe = self

        def generate(model: Any, *args: Any, **kwargs: Any) -> Any:
            rollout = {"start": time.perf_counter() - probe.started, "phases": {}, "cpu": {}}
            probe.rollouts.append(rollout)
            begin, begin_cpu = time.perf_counter(), time.process_time()
            output = original(model, *args, **kwargs)
            rollout["phases"]["generate"] = time.perf_counter() - begin
            rollout["cpu"]["generate"] = time.process_time() - begin_cpu
            prompts = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            sequences = output if torch.is_tensor(output) else output.sequences
            completion = sequences[:, prompts.shape[1] :]
            rollout["rows"] = int(completion.shape[0])
            rollout["prompt_tokens"] = int(
                kwargs["attention_mask"].sum() if "attention_mask" in kwargs else prompts.numel()
            )
            rollout["tokens"] = completion_tokens(completion, probe.eos_id)
            return output

        self.patch(GenerationMixin, "generate", generate)

    def install_backward(self) -> None:
        import accelerate

        self.patch(
            accelerate.Accelerator,
            "backward",
            self.timed("backward", accelerate.Accelerator.backward),
        )

    def result(self) -> dict[str, Any]:
        import resource

        return {
            "rollouts": self.rollouts,
            "step_ends_cpu_s": self.step_ends_cpu,
            "phases_before_first_rollout": self.before,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }


def completion_tokens(completion: Any, eos_id: int) -> int:
    """Tokens generated per row up to and including the first end token, summed over the rows."""
    import torch

    is_eos = completion == eos_id
    width = completion.shape[1]
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, width)
    return int(first.sum())


def set_threads(settings: Settings) -> int:
    import torch

    if settings.threads:
        torch.set_num_threads(settings.threads)
    return torch.get_num_threads()


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "transformers", "accelerate", "trl")}


def farmkit_worker(
    method: str, settings: Settings, paths: dict[str, str], patch: Any = setattr
) -> dict[str, Any]:
    """Run farm-grpo / farm-rloo (its console script's code, in this process) under the probes."""
    import torch

    threads = set_threads(settings)
    from farmkit.lm.models import load_tokenizer
    from farmkit.train import policy as P
    from farmkit.train.checkpoints import RunRecord
    from farmkit.train.scoring import RewardScorer

    probe = Probe(load_tokenizer(paths["policy"]).eos_token_id, patch)
    probe.install_generate()
    probe.install_backward()

    def logits_phase(model: Any, *args: Any, **kwargs: Any) -> str:
        if torch.is_grad_enabled():
            return "train_forward"
        frozen = not next(model.parameters()).requires_grad  # the reference; the policy trains
        return "reference_logprobs" if frozen else "policy_logprobs_nograd"

    def grad_phase(*args: Any, **kwargs: Any) -> str:
        return "train_forward" if torch.is_grad_enabled() else "policy_logprobs_nograd"

    patch(P, "response_logits", probe.timed(logits_phase, P.response_logits))
    patch(P, "token_logprobs", probe.timed(grad_phase, P.token_logprobs))
    patch(P, "entropy", probe.timed(grad_phase, P.entropy))
    patch(RewardScorer, "score", probe.timed("reward", RewardScorer.score))
    log_step = RunRecord.log_step

    def step_end(record: Any, *args: Any, **kwargs: Any) -> Any:
        probe.step_end()  # where the step's elapsed_s was just taken
        return log_step(record, *args, **kwargs)

    patch(RunRecord, "log_step", step_end)

    output = paths["output"]
    args = farmkit_args(
        method, settings, paths["policy"], paths["reward_model"], paths["prompts"], output
    )
    tool = __import__(f"farmkit.tools.farm_{method}", fromlist=["main"])
    try:
        tool.main(args)
    except SystemExit as exit:
        if exit.code:
            raise SystemExit(f"farm-{method} failed with exit status {exit.code}") from None
    rows = [
        json.loads(line)
        for line in Path(output + "-checkpoints", "metrics.jsonl").read_text().splitlines()
    ]
    totals = [0] + [row["tokens_sampled"] for row in rows]
    return {
        "tool": "farmkit",
        "method": method,
        "command": [f"farm-{method}", *args],
        "threads": threads,
        "threads_after": torch.get_num_threads(),
        "step_ends_s": [row["elapsed_s"] for row in rows],
        "probe_step_ends_s": probe.step_ends,  # the same moments on the probe's clock
        "timing_source": "farmkit metrics.jsonl elapsed_s (end of each step)",
        "own_log_tokens": [  # tokens_sampled is a running total
            later - earlier for earlier, later in zip(totals, totals[1:], strict=False)
        ],
        **probe.result(),
    }


def trl_worker(
    method: str,
    settings: Settings,
    paths: dict[str, str],
    patch: Any = setattr,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer / RLOOTrainer in this process under the probes; `overrides`:
    config values beyond trl_config's (bench/gpu_check.py: the GPU, bf16)."""
    import torch

    threads = set_threads(settings)
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from farmkit.core.io import read_records
    from farmkit.lm.models import chat_content, load_tokenizer

    config_class, trainer_class = (
        (trl.GRPOConfig, trl.GRPOTrainer) if method == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    )
    probe = Probe(load_tokenizer(paths["policy"]).eos_token_id, patch)
    probe.install_generate()
    probe.install_backward()

    def logprobs_phase(trainer: Any, model: Any, *args: Any, **kwargs: Any) -> str:
        if torch.is_grad_enabled():
            return "train_forward"
        return "reference_logprobs" if model is trainer.ref_model else "policy_logprobs_nograd"

    patch(
        trainer_class,
        "_get_per_token_logps_and_entropies",
        probe.timed(logprobs_phase, trainer_class._get_per_token_logps_and_entropies),
    )
    patch(
        trainer_class, "_calculate_rewards", probe.timed("reward", trainer_class._calculate_rewards)
    )

    logged: list[dict[str, Any]] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            probe.step_end()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
            logged.append(dict(logs or {}))

    records = list(read_records(paths["prompts"], "instruction"))
    dataset = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "user", "content": chat_content(r["instruction"], r.get("input"))}
                ]
            }
            for r in records
        ]
    )
    kwargs = {**trl_config(method, settings, paths["output"]), **(overrides or {})}
    config = config_class(**kwargs)
    trainer = trainer_class(
        model=paths["policy"],
        reward_funcs=paths["reward_model"],
        args=config,
        train_dataset=dataset,
        callbacks=[StepClock()],
    )
    trainer.train()
    threads_after = torch.get_num_threads()
    every = settings.updates_per_step
    lengths = [log["completions/mean_length"] for log in logged if "completions/mean_length" in log]
    return {
        "tool": "trl",
        "method": method,
        "config": {key: _plain(value) for key, value in kwargs.items()},
        "derived": {
            name: _plain(getattr(config, name))
            for name in (
                "generation_batch_size",
                "steps_per_generation",
                "optim",
                "lr_scheduler_type",
                "top_k",
                "top_p",
            )
        },
        "threads": threads,
        "threads_after": threads_after,
        **probe.result(),
        # the end of each rollout's last optimizer step
        "step_ends_s": probe.step_ends[every - 1 :: every],
        "step_ends_cpu_s": probe.step_ends_cpu[every - 1 :: every],
        "timing_source": "TRL on_step_end callback (end of each optimizer step)",
        "own_log_tokens": [round(length * settings.rollout) for length in lengths][::every],
        "own_log_step_time_s": [log["step_time"] for log in logged if "step_time" in log],
    }


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


WORKERS = {"farmkit": farmkit_worker, "trl": trl_worker}


def worker_main(tool: str, method: str, settings_json: str, paths_json: str, out: str) -> None:
    """One tool's run (`bench_rl.py --worker ...`, a process of its own): its result to `out`."""
    settings = Settings(**json.loads(settings_json))
    paths = json.loads(paths_json)
    result = WORKERS[tool](method, settings, paths)
    result["versions"] = versions()
    Path(out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# The parent: set-up, alternating runs, summary


def summarize(result: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Seconds per timed step (wall, and the process's CPU time), generated tokens per second and
    the phases per step of one run."""
    ends, cpu_ends, rollouts = result["step_ends_s"], result["step_ends_cpu_s"], result["rollouts"]
    if not len(ends) == len(cpu_ends) == len(rollouts) == settings.total_steps:
        raise ValueError(
            f"{result['tool']} {result['method']}: {len(ends)} step ends and {len(rollouts)} "
            f"rollouts, expected {settings.total_steps}"
        )
    timed = range(settings.warmup, settings.total_steps)
    summary: dict[str, Any] = {
        "step_seconds": [ends[i] - ends[i - 1] for i in timed],
        "cpu_step_seconds": [cpu_ends[i] - cpu_ends[i - 1] for i in timed],
        "tokens": [rollouts[i]["tokens"] for i in timed],
        "rows_per_step": rollouts[settings.warmup]["rows"],
        "prompt_tokens_per_step": sum(rollouts[i]["prompt_tokens"] for i in timed) / len(timed),
    }
    for key, clock in (("phases_per_step", "phases"), ("cpu_phases_per_step", "cpu")):
        summary[key] = {
            name: sum(rollouts[i][clock].get(name, 0.0) for i in timed) / len(timed)
            for name in PHASES
        }
    return _rates(summary)


def _rates(summary: dict[str, Any]) -> dict[str, Any]:
    """Per-step means and tokens per second from the lists of timed steps; 'other' is the rest of
    a step beyond the measured phases."""
    steps, cpu_steps = summary["step_seconds"], summary["cpu_step_seconds"]
    summary["seconds_per_step"] = sum(steps) / len(steps)
    summary["cpu_seconds_per_step"] = sum(cpu_steps) / len(cpu_steps)
    summary["tokens_per_step"] = sum(summary["tokens"]) / len(steps)
    summary["tokens_per_second"] = sum(summary["tokens"]) / sum(steps)
    summary["tokens_per_cpu_second"] = sum(summary["tokens"]) / sum(cpu_steps)
    for key, per_step in (
        ("phases_per_step", "seconds_per_step"),
        ("cpu_phases_per_step", "cpu_seconds_per_step"),
    ):
        phases = {name: value for name, value in summary[key].items() if name != "other"}
        summary[key] = {**phases, "other": summary[per_step] - sum(phases.values())}
    return summary


def pooled(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Several rounds of one tool as one: their timed steps together."""
    together: dict[str, Any] = {
        key: [value for summary in summaries for value in summary[key]]
        for key in ("step_seconds", "cpu_step_seconds", "tokens")
    }
    for key in ("phases_per_step", "cpu_phases_per_step"):
        together[key] = {
            name: sum(s[key][name] * len(s["step_seconds"]) for s in summaries)
            / len(together["step_seconds"])
            for name in PHASES
        }
    return _rates(together)


def run_worker(
    tool: str, method: str, settings: Settings, paths: dict[str, str], work: Path
) -> dict[str, Any]:
    out = work / f"{tool}-{method}-{time.monotonic_ns()}.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        tool,
        method,
        json.dumps(dataclasses.asdict(settings)),
        json.dumps(paths),
        str(out),
    ]
    began = time.perf_counter()
    # fp32 on both sides (TRL's bf16=False): farmkit's --precision auto would pick bf16 on a CPU
    # with native bf16 (bench_precision measures that)
    environment = {**os.environ, "FARMKIT_PRECISION": "fp32"}
    done = subprocess.run(command, capture_output=True, text=True, env=environment)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(
            f"{tool} {method} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )
    result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    return result


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def figure_rows(method: str, farmkit: dict[str, Any], peer: dict[str, Any], label: str) -> list:
    """bench/run.py's rows: farmkit's figure, TRL's beside it, the ratio farmkit / TRL."""
    trainer = "GRPOTrainer" if method == "grpo" else "RLOOTrainer"
    rows = []
    for key, what, unit, target in (
        ("seconds_per_step", "seconds per step", "s/step", "<= 1"),
        ("tokens_per_second", "generated tokens per second", "tokens/s", ">= 1"),
        ("cpu_seconds_per_step", "CPU seconds per step (its process)", "CPU s/step", "<= 1"),
    ):
        ratio = farmkit[key] / peer[key]
        rows.append(
            {
                "benchmark": "rl",
                "figure": f"farm-{method} vs TRL {trainer}: {what} ({label})",
                "value": round(farmkit[key], 3),
                "unit": unit,
                "peer": f"TRL {trainer}",
                "peer_value": round(peer[key], 3),
                "ratio": round(ratio, 3),
                "target": target,
                "met": ratio <= 1 if target == "<= 1" else ratio >= 1,
            }
        )
    return rows


def ratios(farmkit: dict[str, Any], peer: dict[str, Any]) -> dict[str, float]:
    keys = (
        "seconds_per_step",
        "tokens_per_second",
        "cpu_seconds_per_step",
        "tokens_per_cpu_second",
    )
    return {key: farmkit[key] / peer[key] for key in keys}


def print_table(report: dict[str, Any]) -> None:
    header = ["method", "tool", "clock", "s/step", "steps (s)", "tokens/step", "tokens/s"]
    header += list(PHASES) + ["other"]
    rows = [header]
    for method, entry in report["methods"].items():
        for clock, prefix in (("wall", ""), ("cpu", "cpu_")):
            for tool in TOOLS:
                summary = entry["summary"][tool]
                phases = summary[f"{prefix}phases_per_step"]
                rows.append(
                    [
                        method,
                        tool,
                        clock,
                        f"{summary[f'{prefix}seconds_per_step']:.2f}",
                        " ".join(f"{s:.1f}" for s in summary[f"{prefix}step_seconds"]),
                        f"{summary['tokens_per_step']:.0f}",
                        f"{summary['tokens_per_cpu_second' if prefix else 'tokens_per_second']:.1f}",
                    ]
                    + [f"{phases[name]:.2f}" for name in PHASES + ("other",)]
                )
            ratio = entry["ratios"]
            rows.append(
                [
                    method,
                    "farmkit/TRL",
                    clock,
                    f"{ratio[f'{prefix}seconds_per_step']:.3f}",
                    "",
                    "",
                    f"{ratio['tokens_per_cpu_second' if prefix else 'tokens_per_second']:.3f}",
                ]
                + [
                    f"{entry['summary']['farmkit'][f'{prefix}phases_per_step'][name] - entry['summary']['trl'][f'{prefix}phases_per_step'][name]:+.2f}"
                    for name in PHASES + ("other",)
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    print("\n".join(line.rstrip() for line in lines), file=sys.stderr)
    print(
        "(per timed step; wall: seconds, cpu: CPU seconds of the tool's process; phases: time in "
        "each, 'other' = the rest: optimizer step, loss, logging; the farmkit/TRL rows give the "
        "ratios of s/step and tokens/s and the phases' differences in seconds)",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="grpo,rloo", help="comma-separated: grpo, rloo")
    parser.add_argument("--model", default="embedded", help="policy and reward-model body")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each tool, order alternating"
    )
    parser.add_argument("--json", default=str(HERE / "out" / "bench_rl.json"))
    parser.add_argument("--keep", help="keep the work folder (models, outputs) here")
    defaults = Settings()
    for field in dataclasses.fields(Settings):
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            type=type(getattr(defaults, field.name)),
            default=getattr(defaults, field.name),
        )
    options = parser.parse_args(argv)
    settings = Settings(
        **{field.name: getattr(options, field.name) for field in dataclasses.fields(Settings)}
    )
    settings.check()
    methods = [m for m in options.methods.split(",") if m]
    if set(methods) - {"grpo", "rloo"}:
        raise SystemExit("--methods: grpo and/or rloo")

    from farmkit.lm.models import resolve

    policy = resolve(options.model)
    context = (
        tempfile.TemporaryDirectory(prefix="bench_rl-")
        if options.keep is None
        else _Kept(options.keep)
    )
    began = time.time()
    load_before = load_average()
    with context as folder:
        work = Path(folder)
        reward_model = build_reward_model(policy, work / "reward-model", settings.seed)
        prompts = work / "prompts.jsonl"
        records = prompt_records(settings.prompts_per_step * settings.total_steps)
        prompts.write_text("".join(json.dumps(record) + "\n" for record in records))
        check_prompts(policy, records)
        report: dict[str, Any] = {
            "benchmark": "rl",
            "settings": dataclasses.asdict(settings),
            "model": policy,
            "machine": {"cpus": os.cpu_count(), "load_average_before": load_before},
            "methods": {},
        }
        for index, method in enumerate(methods):
            runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in TOOLS}
            for round_ in range(options.rounds):
                order = TOOLS if (index + round_) % 2 == 0 else TOOLS[::-1]
                for tool in order:
                    paths = {
                        "policy": policy,
                        "reward_model": str(reward_model),
                        "prompts": str(prompts),
                        "output": str(work / f"{tool}-{method}-{round_}"),
                    }
                    print(f"{method}: {tool} (round {round_ + 1}) ...", file=sys.stderr, flush=True)
                    result = run_worker(tool, method, settings, paths, work)
                    result["order"] = f"round {round_ + 1}, {order.index(tool) + 1} of 2"
                    result["summary"] = summarize(result, settings)
                    runs[tool].append(result)
            summary = {tool: pooled([r["summary"] for r in runs[tool]]) for tool in TOOLS}
            report["methods"][method] = {
                "runs": runs,
                "summary": summary,
                "ratios": ratios(summary["farmkit"], summary["trl"]),
            }
    report["machine"]["load_average_after"] = load_average()
    report["wall_seconds"] = round(time.time() - began, 1)
    report["versions"] = report["methods"][methods[0]]["runs"]["trl"][0]["versions"]
    label = (
        f"{settings.prompts_per_step} prompts x {settings.samples} samples, "
        f"{settings.max_new_tokens} new tokens, {settings.steps} timed steps after {settings.warmup}"
    )
    figures = []
    for method, entry in report["methods"].items():
        figures += figure_rows(method, entry["summary"]["farmkit"], entry["summary"]["trl"], label)
    report["figures"] = figures
    Path(options.json).parent.mkdir(parents=True, exist_ok=True)
    Path(options.json).write_text(json.dumps(report, indent=1))
    print_table(report)
    print(
        f"load average before {load_before}, after {report['machine']['load_average_after']}; "
        f"{report['wall_seconds']} s in all; full result in {options.json}",
        file=sys.stderr,
    )
    for row in figures:
        print(json.dumps({**row, "settings": report["settings"]}), flush=True)
    return 0


def check_prompts(policy: str, records: list[dict[str, str]]) -> None:
    """farmkit's formatted prompt and TRL's chat template give the same token ids."""
    from farmkit.lm.models import PromptFormat, chat_messages, load_tokenizer

    tokenizer = load_tokenizer(policy)
    fmt = PromptFormat.for_model(policy)
    for record in records:
        ours = tokenizer(fmt.record_prompt(tokenizer, record), add_special_tokens=False)
        theirs = tokenizer.apply_chat_template(
            chat_messages(record["instruction"], record.get("input")),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )
        if list(ours["input_ids"]) != list(theirs["input_ids"]):
            raise SystemExit(f"prompt token ids differ between the tools: {record}")


class _Kept:
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __enter__(self) -> str:
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        return self.folder

    def __exit__(self, *exc: Any) -> None:
        return None


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(*sys.argv[2:7])
    else:
        sys.exit(main())
