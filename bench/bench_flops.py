"""Training and decoding against this CPU's limit, beside TRL and transformers, in one process.

The limits are measured first, in the same run and the same way as the steps: CPU seconds
(user + system of this process) with one torch thread, so the figures are per core and the load of
other processes on a shared machine weighs on them little (it still costs caches and memory
bandwidth).

- peak matrix product FLOP/s per core, fp32 and bf16: the best of BENCH_FLOPS_REPEATS products of
  two shapes (the embedded model's MLP, 2048x576 @ 576x1536, and 2048x2048 @ 2048x2048);
- memory bandwidth per core: the best of the same repeats of a 256 MiB read (a sum), copy and triad
  (a = b + s c), bytes read and written (a write's read for ownership not counted); the bound uses
  the largest of the three (the most a core was seen to move);
- the theoretical figures where this CPU's vector units are known (`theoretical_peak`): cores x the
  clock /proc/cpuinfo reports x FLOPs per cycle. The shares use the measured peaks.

Training: farmkit's SFT step (farmkit.methods.sft.train_sft) and reward-model step
(farmkit.methods.reward.train_reward_model) on the embedded model, and the same step through TRL's
SFTTrainer and RewardTrainer at their defaults (`use_cpu=True, bf16=False,
gradient_checkpointing=False`), on identical batches: the dataset is one batch (BENCH_FLOPS_BATCH,
the demo's 8 demonstrations or 8 pairs of the demo's instructions), so every step trains the same
tokens. Each run takes 1 + BENCH_FLOPS_STEPS steps; the first is a warm-up and the steps after it are
timed from the end of one optimizer step to the end of the last (everything a step does: batch,
forward, backward, optimizer, the trainer's checks and logs). The sides alternate, A B A B, for
BENCH_FLOPS_ROUNDS rounds. FLOPs are farmkit.train.metrics.StepWork's: 6 x parameters x the batch's
tokens (padding left out), the parameters those of the matrix products (`matmul_parameters`: a
reward model's input embedding is a lookup, a tied language-model head is a product).

Decoding: farmkit.lm.generation.generate and transformers' plain `generate`, temperature 1, 32 new
tokens, at batch 1 (BENCH_FLOPS_SOLO prompts, one at a time) and at the demo's batch (32 prompts in one
batch), the demo's prompts in the embedded model's template. Tokens are the sampled ones up to and
including the end token. The bound (`decode_bound_seconds`) is a roofline over what each generate
call did: its prefill at the fp32 peak, then each decoding step the larger of (weights + the batch's
KV cache read) / bandwidth and 2 x parameters x rows / peak.

    python bench/bench_flops.py                    # all three parts, one after another
    BENCH_FLOPS_PARTS=decode python bench/bench_flops.py   # or sft, reward: one part (13-22 min each
                                                          # at load 13-22 on the 2-core machine)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from farmkit.train.metrics import StepWork  # noqa: E402

MIB = 1 << 20


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# Arithmetic (tests/bench/test_bench_flops.py)


def matmul_parameters(model: Any) -> int:
    """The parameters that take part in matrix products: all of them but an input embedding that is
    only looked up (not tied to an output head that multiplies by it)."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embedding is not None and (head is None or head.weight is not embedding.weight):
        total -= embedding.weight.numel()
    return total


def training_flops(parameters: int, tokens: float) -> float:
    """A training step's FLOPs as metrics.jsonl counts them: 6 x parameters per token trained."""
    return StepWork(parameters=parameters, generated=0, forward=0, trained=tokens).flops()


def kv_bytes_per_token(config: Any, bytes_per_value: int) -> int:
    """Bytes of KV cache one token of context holds over all layers (keys and values)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * bytes_per_value


def decode_bound_seconds(
    calls: Sequence[tuple[int, int, int]],
    parameters: int,
    weight_bytes: int,
    kv_per_token: int,
    bandwidth: float,
    peak_flops: float,
) -> float:
    """The least time the generate calls (rows, prompt width, new tokens) could take: each call's
    prefill (2 x parameters x rows x prompt width FLOPs, which yields the first new token) at the
    peak, then one decoding step per further token, each the larger of its bytes (the weights and
    the rows' KV cache of the context so far) over the bandwidth and its FLOPs over the peak."""
    total = 0.0
    for rows, prompt_width, new in calls:
        total += 2 * parameters * rows * prompt_width / peak_flops
        for step in range(1, new):
            context = prompt_width + step
            read = weight_bytes + rows * kv_per_token * context
            total += max(read / bandwidth, 2 * parameters * rows / peak_flops)
    return total


# FLOPs per cycle per core (fp32, bf16) of vector units this script knows: (vendor, family, the
# lowest model number, the flag that must be present)
KNOWN_CORES = (
    # AMD Zen 4 (family 25, models 0x10 and up: Genoa, Raphael, Phoenix): two 256-bit FMA pipes (a
    # 512-bit instruction takes two passes): 2 x 8 lanes x 2 FLOPs; VDPBF16PS doubles the lanes
    ("AuthenticAMD", 25, 0x10, "avx512_bf16", "AMD Zen 4", 32, 64),
)


def theoretical_peak(cpuinfo: str) -> dict[str, Any] | None:
    """Theoretical fp32 and bf16 FLOP/s per core (the clock /proc/cpuinfo reports x FLOPs per cycle)
    of a core listed in KNOWN_CORES, else None (no guess)."""

    def field(name: str) -> str | None:
        found = re.search(rf"^{name}\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        return found.group(1).strip() if found else None

    vendor, family, model = field("vendor_id"), field("cpu family"), field("model")
    mhz, flags = field("cpu MHz"), (field("flags") or "").split()
    if not (vendor and family and model and mhz):
        return None
    for known_vendor, known_family, lowest_model, flag, name, fp32, bf16 in KNOWN_CORES:
        if (
            vendor == known_vendor
            and int(family) == known_family
            and int(model) >= lowest_model
            and flag in flags
        ):
            hz = float(mhz) * 1e6
            return {"core": name, "hz": hz, "fp32": hz * fp32, "bf16": hz * bf16}
    return None


def useful_tokens(completions: Any, eos_id: int) -> int:
    """Sampled tokens per row up to and including the first end token, summed."""
    total = 0
    for row in completions.tolist():
        total += row.index(eos_id) + 1 if eos_id in row else len(row)
    return total


def row(figure: str, value: float, unit: str, peer: str, peer_value: float | None, **extra: Any):
    ratio = value / peer_value if peer_value else None
    return {
        "benchmark": "flops",
        "figure": figure,
        "value": value,
        "unit": unit,
        "peer": peer,
        "peer_value": peer_value,
        "ratio": ratio,
        **extra,
    }


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


# ---------------------------------------------------------------------------------------------
# The machine's limits


def best_rate(work: float, action: Callable[[], Any], repeats: int) -> float:
    """work / the least CPU time of `repeats` calls (after one warm-up)."""
    action()
    least = float("inf")
    for _ in range(repeats):
        started = cpu_seconds()
        action()
        least = min(least, cpu_seconds() - started)
    return work / least


def measure_limits(repeats: int) -> dict[str, float]:
    import torch

    limits = {}
    shapes = ((2048, 576, 1536), (2048, 2048, 2048))
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        best = 0.0
        for m, k, n in shapes:
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            out = torch.empty(m, n, dtype=dtype)
            inner = 4 if m * k * n < 4e9 else 1  # about the same work per call

            def product(a=a, b=b, out=out, inner=inner) -> None:
                for _ in range(inner):
                    torch.mm(a, b, out=out)

            best = max(best, best_rate(2.0 * m * k * n * inner, product, repeats))
        limits[name] = best
    count = 256 * MIB // 4
    a, b, c = torch.empty(count), torch.randn(count), torch.randn(count)
    limits["read"] = best_rate(4.0 * count, lambda: b.sum(), repeats)
    limits["copy"] = best_rate(8.0 * count, lambda: a.copy_(b), repeats)
    limits["triad"] = best_rate(12.0 * count, lambda: torch.add(b, c, alpha=3.0, out=a), repeats)
    limits["bandwidth"] = max(limits["read"], limits["copy"], limits["triad"])
    return limits


# ---------------------------------------------------------------------------------------------
# Training steps


class StepClock:
    """CPU-time stamps at the end of each optimizer step; `seconds_after_first()` is the time of
    the steps after the first (the warm-up)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def stamp(self) -> None:
        self.stamps.append(cpu_seconds())

    def steps_after_first(self) -> tuple[int, float]:
        return len(self.stamps) - 1, self.stamps[-1] - self.stamps[0]

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class Stamp(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.stamp()

        return Stamp()


def farmkit_clock() -> tuple[StepClock, Callable[[], None]]:
    """A clock stamped by farmkit's trainers' check after each optimizer step (check_finite with the
    model: farm-sft's FiniteGuard.on_step_end, the reward loop after optimizer.step()), and the
    function that takes the stamp off again."""
    from farmkit.train import checkpoints

    clock, original = StepClock(), checkpoints.check_finite

    def stamped(step: int, loss: Any = None, model: Any = None) -> None:
        original(step, loss, model)
        if model is not None:
            clock.stamp()

    checkpoints.check_finite = stamped

    def restore() -> None:
        checkpoints.check_finite = original

    return clock, restore


def sft_examples(count: int) -> list[dict[str, str]]:
    lines = (ROOT / "examples" / "data" / "instructions.jsonl").read_text().splitlines()[:count]
    return [
        {key: json.loads(line)[key] for key in ("instruction", "input", "output")} for line in lines
    ]


def trl_args(config_class: Any, folder: str, steps: int, batch: int) -> Any:
    """TRL's trainer settings for the comparison, the same for SFTTrainer and RewardTrainer: fp32 on
    the CPU, no gradient checkpointing, logging or saving, 1 + `steps` steps of `batch`."""
    return config_class(
        output_dir=folder,
        max_steps=1 + steps,
        per_device_train_batch_size=batch,
        learning_rate=1e-5,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )


def sft_runs(batch: int, steps: int, rounds: int, peaks: dict[str, float]) -> None:
    from datasets import Dataset
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    from farmkit.lm.models import PromptFormat, load_causal_lm, resolve
    from farmkit.methods.sft import SFTConfig, tokenize_examples, train_sft

    path = resolve("embedded")
    examples = sft_examples(batch)
    model, tokenizer = load_causal_lm(path, device="cpu", dtype="float32")
    parameters = matmul_parameters(model)
    del model
    # as train_sft tokenizes them: the model's template, no sampling control token
    prompt_format = replace(PromptFormat.for_model(path), control=None)
    rows = tokenize_examples(tokenizer, prompt_format, examples, 512)
    tokens = sum(len(r["input_ids"]) for r in rows)
    padded = len(rows) * max(len(r["input_ids"]) for r in rows)

    def farmkit_run() -> tuple[int, float, int]:
        clock, restore = farmkit_clock()
        # fp32 on both sides (TRL's is bf16=False): the shares are of the fp32 peak
        config = SFTConfig(max_steps=1 + steps, batch_size=batch, device="cpu", precision="fp32")
        with tempfile.TemporaryDirectory() as folder:
            try:
                train_sft("embedded", examples, Path(folder) / "sft", config)
            finally:
                restore()
        return (*clock.steps_after_first(), parameters)

    def trl_run() -> tuple[int, float, int]:
        clock = StepClock()
        model, tok = load_causal_lm(path, device="cpu", dtype="float32")
        tok.padding_side = "right"
        with tempfile.TemporaryDirectory() as folder:
            args = trl_args(TRLConfig, folder, steps, batch)
            trainer = SFTTrainer(
                model=model,
                args=args,
                train_dataset=Dataset.from_list(rows),
                processing_class=tok,
                callbacks=[clock.callback()],
            )
            trainer.train()
        return (*clock.steps_after_first(), parameters)

    compare(
        "SFT step",
        {"farmkit": farmkit_run, "TRL SFTTrainer": trl_run},
        rounds,
        tokens,
        padded,
        peaks,
    )


def reward_runs(batch: int, steps: int, rounds: int, peaks: dict[str, float]) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification
    from trl import RewardConfig as TRLConfig
    from trl import RewardTrainer

    from farmkit.core.records import Comparison
    from farmkit.lm.models import load_tokenizer, resolve
    from farmkit.methods.reward import RewardConfig, train_reward_model
    from farmkit.train.scoring import reward_format, reward_text, tail_token_ids

    path = resolve("embedded")
    examples = sft_examples(2 * batch)
    # output_2 (the instruction's own answer) is preferred to another instruction's answer
    items = [
        Comparison(e["instruction"], e["input"], examples[batch + i]["output"], e["output"], 1.0)
        for i, e in enumerate(examples[:batch])
    ]
    tokenizer = load_tokenizer(path, padding_side="right")
    prompt_format = reward_format(path, tokenizer, None)

    def ids(outputs: list[str]) -> list[list[int]]:
        texts = [
            reward_text(tokenizer, prompt_format, c.instruction, c.input, out)
            for c, out in zip(items, outputs, strict=True)
        ]
        return tail_token_ids(tokenizer, texts, 512)

    chosen, rejected = ids([c.chosen for c in items]), ids([c.rejected for c in items])
    sequences = chosen + rejected
    tokens = sum(len(s) for s in sequences)
    padded = len(sequences) * max(len(s) for s in sequences)

    def load() -> Any:
        network = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=torch.float32
        )
        network.config.pad_token_id = tokenizer.pad_token_id
        return network

    parameters = matmul_parameters(load())

    def farmkit_run() -> tuple[int, float, int]:
        clock, restore = farmkit_clock()
        config = RewardConfig(
            max_steps=1 + steps,
            batch_size=batch,
            eval_fraction=0.0,
            device="cpu",
            precision="fp32",  # as TRL's side (bf16=False): the shares are of the fp32 peak
        )
        with tempfile.TemporaryDirectory() as folder:
            try:
                train_reward_model("embedded", items, Path(folder) / "rm", config)
            finally:
                restore()
        return (*clock.steps_after_first(), parameters)

    def trl_run() -> tuple[int, float, int]:
        clock = StepClock()
        network = load()
        with tempfile.TemporaryDirectory() as folder:
            args = trl_args(TRLConfig, folder, steps, batch)
            data = Dataset.from_list(
                [
                    {"chosen_ids": c, "rejected_ids": r}
                    for c, r in zip(chosen, rejected, strict=True)
                ]
            )
            trainer = RewardTrainer(
                model=network,
                args=args,
                train_dataset=data,
                processing_class=tokenizer,
                callbacks=[clock.callback()],
            )
            trainer.train()
        return (*clock.steps_after_first(), parameters)

    compare(
        "reward-model step",
        {"farmkit": farmkit_run, "TRL RewardTrainer": trl_run},
        rounds,
        tokens,
        padded,
        peaks,
    )


def compare(
    what: str,
    sides: dict[str, Callable[[], tuple[int, float, int]]],
    rounds: int,
    tokens: int,
    padded: int,
    peaks: dict[str, float],
) -> None:
    """Run the sides alternately (A B, then B A, ...) and emit each side's FLOP/s per CPU second
    against the fp32 peak (the steps run in fp32), with the bf16 peak beside it."""
    import torch

    names = list(sides)
    done = {name: [0, 0.0, 0] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            torch.set_num_threads(1)
            # the trainers print their summaries on stdout, which carries this script's figures
            with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
                count, seconds, parameters = sides[name]()
            done[name][0] += count
            done[name][1] += seconds
            done[name][2] = parameters
    achieved = {}
    for name in names:
        count, seconds, parameters = done[name]
        flops = training_flops(parameters, tokens) * count
        achieved[name] = flops / seconds
        emit(
            row(
                f"{what}, {name}: FLOP/s per CPU second ({count} steps of {tokens} tokens, "
                f"{padded} with padding; {parameters / 1e6:.1f}M parameters; "
                f"{seconds / count:.2f} CPU s a step)",
                achieved[name],
                "FLOP/s",
                "fp32 peak per core",
                peaks["fp32"],
                bf16_share=achieved[name] / peaks["bf16"],
                padded_share=achieved[name] * padded / tokens / peaks["fp32"],
                step_cpu_s=seconds / count,
            )
        )
    first, second = names
    emit(
        row(
            f"{what}: {first} against {second}, FLOP/s per CPU second",
            achieved[first],
            "FLOP/s",
            second,
            achieved[second],
        )
    )


# ---------------------------------------------------------------------------------------------
# Decoding


def decode_runs(solo: int, batch: int, rounds: int, limits: dict[str, float]) -> None:
    import torch

    from farmkit.lm.generation import DecodingConfig, generate
    from farmkit.lm.models import PromptFormat, load_causal_lm, resolve

    path = resolve("embedded")
    model, tokenizer = load_causal_lm(path, device="cpu")
    prompt_format = PromptFormat.for_model(path)
    lines = (ROOT / "examples" / "data" / "instructions.jsonl").read_text().splitlines()[:batch]
    prompts = [prompt_format.record_prompt(tokenizer, json.loads(line)) for line in lines]
    eos = tokenizer.eos_token_id
    parameters = matmul_parameters(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = kv_bytes_per_token(model.config, next(model.parameters()).element_size())

    calls: list[tuple[int, int, int]] = []
    produced = [0]  # sampled tokens (to the end token) of the calls so far
    original = model.generate

    def recorded(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        width = kwargs["input_ids"].shape[1]
        calls.append((output.shape[0], width, output.shape[1] - width))
        produced[0] += useful_tokens(output[:, width:], eos)
        return output

    model.generate = recorded
    new_tokens = 32

    def farmkit_side(size: int, count: int) -> Callable[[int], None]:
        config = DecodingConfig(n=1, temperature=1.0, max_new_tokens=new_tokens, batch_size=size)
        return lambda seed: generate(model, tokenizer, prompts[:count], config, seed=seed)

    def plain_side(size: int, count: int) -> Callable[[int], None]:
        def run(seed: int) -> None:
            torch.manual_seed(seed)
            for start in range(0, count, size):
                encoded = tokenizer(
                    prompts[start : start + size],
                    add_special_tokens=False,
                    padding=True,
                    return_tensors="pt",
                )
                with torch.no_grad():
                    model.generate(
                        **encoded,
                        do_sample=True,
                        temperature=1.0,
                        top_p=1.0,
                        top_k=0,
                        max_new_tokens=new_tokens,
                        pad_token_id=tokenizer.pad_token_id,
                    )

        return run

    for size, count in ((1, solo), (batch, batch)):
        sides = {
            "farmkit generate": farmkit_side(size, count),
            "transformers generate": plain_side(size, count),
        }
        for side in sides.values():  # warm-up
            side(99)
        figures = {name: [0, 0.0, 0.0, 0] for name in sides}  # tokens, CPU s, bound s, row-steps
        for r in range(rounds):
            for name in sides if r % 2 == 0 else list(sides)[::-1]:
                calls.clear()
                produced[0] = 0
                started = cpu_seconds()
                sides[name](r)
                seconds = cpu_seconds() - started
                bound = decode_bound_seconds(
                    calls, parameters, weight_bytes, kv, limits["bandwidth"], limits["fp32"]
                )
                figures[name][0] += produced[0]
                figures[name][1] += seconds
                figures[name][2] += bound
                figures[name][3] += sum(rows * new for rows, _, new in calls)
        for name, (tokens, seconds, bound, row_steps) in figures.items():
            emit(
                row(
                    f"decoding, {name}, batch {size} ({count} prompts, {new_tokens} new tokens, "
                    f"T=1, {rounds} rounds): sampled tokens per CPU second against the "
                    f"roofline bound (weights + KV cache / read bandwidth; prefill at the fp32 peak)",
                    tokens / seconds,
                    "tokens/s",
                    "bound",
                    tokens / bound,
                    # the share of the rows' decoding positions that were sampled tokens (the rest
                    # ran after a row's end token, until the batch's longest answer ended)
                    sampled_share=tokens / row_steps,
                )
            )
    model.generate = original


def main() -> None:
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)
    repeats = int(os.environ.get("BENCH_FLOPS_REPEATS", "5"))
    steps = int(os.environ.get("BENCH_FLOPS_STEPS", "2"))
    rounds = int(os.environ.get("BENCH_FLOPS_ROUNDS", "2"))
    batch = int(os.environ.get("BENCH_FLOPS_BATCH", "8"))
    solo = int(os.environ.get("BENCH_FLOPS_SOLO", "4"))
    parts = os.environ.get("BENCH_FLOPS_PARTS", "sft,reward,decode").split(",")

    limits = measure_limits(repeats)
    theory = theoretical_peak(
        Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    )
    for name in ("fp32", "bf16"):
        known = theory[name] if theory else None
        emit(
            row(
                f"peak matrix product FLOP/s per core, {name} (one thread, CPU time, best of "
                f"{repeats}); against "
                + (
                    f"the theoretical {theory['core']} at {theory['hz'] / 1e9:.2f} GHz"
                    if theory
                    else "no theoretical figure (vector units not known)"
                ),
                limits[name],
                "FLOP/s",
                "theoretical",
                known,
            )
        )
    for name in ("read", "copy", "triad"):
        emit(
            row(
                f"memory bandwidth per core, 256 MiB {name} (one thread, CPU time, best of "
                f"{repeats})",
                limits[name],
                "bytes/s",
                "",
                None,
            )
        )
    if "sft" in parts:
        sft_runs(batch, steps, rounds, limits)
    if "reward" in parts:
        reward_runs(batch, steps, rounds, limits)
    if "decode" in parts:
        decode_runs(solo, int(os.environ.get("BENCH_FLOPS_DECODE_BATCH", "32")), rounds, limits)


if __name__ == "__main__":
    main()
