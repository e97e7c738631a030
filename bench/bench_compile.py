"""torch.compile of a training step on the CPU against eager (what every farmkit trainer runs): the
compile's own CPU time, and the CPU time per step after it, on the embedded model, one torch thread.

A step is the forward and backward of the causal LM loss (farm-sft's step without its optimizer) on a
batch of 8 demonstrations, right-padded with their attention mask: BENCH_COMPILE_BATCHES (3) batches
of the shipped instructions (examples/data/instructions.jsonl, in the embedded model's template), of
different lengths as the tools' batches are. The compile figure is the first pass of the compiled
model over those batches (each new length may compile again); then BENCH_COMPILE_ROUNDS (2) rounds
over them, eager and compiled interleaved. It pays where compile + steps x compiled < steps x eager
over a run's steps: the figure `break-even steps` is compile / (eager - compiled) per step. Inductor
compiles in this process (TORCHINDUCTOR_COMPILE_THREADS=1), so that its CPU time is counted.

    python bench/bench_compile.py
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    # inductor compiles in this process, so that its CPU time is this process's (its worker
    # processes' would not be counted until they exit)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch

    from farmkit.lm.models import PromptFormat, load_causal_lm, resolve

    torch.set_num_threads(int(os.environ.get("BENCH_COMPILE_THREADS", "1")))
    count = int(os.environ.get("BENCH_COMPILE_BATCHES", "3"))
    rounds = int(os.environ.get("BENCH_COMPILE_ROUNDS", "2"))
    path = resolve("embedded")
    model, tokenizer = load_causal_lm(path, device="cpu", dtype="float32")
    model.train()
    tokenizer.padding_side = "right"
    fmt = PromptFormat.for_model(path, "auto")
    examples = [
        json.loads(line) for line in open(ROOT / "examples" / "data" / "instructions.jsonl")
    ][: 8 * count]
    batches = []
    for start in range(0, len(examples), 8):
        texts = [
            fmt.prompt(tokenizer, e["instruction"], e.get("input")) + e["output"]
            for e in examples[start : start + 8]
        ]
        batch = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        batches.append(dict(batch))
    compiled = torch.compile(model)

    def step(network, batch) -> None:
        network.zero_grad(set_to_none=True)
        network(**batch, use_cache=False).loss.backward()

    start = cpu_seconds()
    for batch in batches:
        step(compiled, batch)
    compile_s = cpu_seconds() - start
    spent = {"eager": 0.0, "compiled": 0.0}
    for _ in range(rounds):
        for batch in batches:
            for name, network in (("eager", model), ("compiled", compiled)):
                start = cpu_seconds()
                step(network, batch)
                spent[name] += cpu_seconds() - start
    steps = rounds * len(batches)
    eager, fast = spent["eager"] / steps, spent["compiled"] / steps
    saved = eager - fast
    for figure, value, peer, peer_value, ratio, target, met in (
        (
            "step after compiling (per step)",
            fast,
            "eager",
            eager,
            fast / eager,
            "< 1",
            fast < eager,
        ),
        (
            "compile (first pass over the batches)",
            compile_s,
            "eager step",
            eager,
            compile_s / eager,
            "",
            None,
        ),
        (
            "break-even steps",
            compile_s / saved if saved > 0 else float("inf"),
            "",
            None,
            None,
            "",
            None,
        ),
    ):
        print(
            json.dumps(
                {
                    "benchmark": "compile",
                    "figure": figure,
                    "value": round(value, 3),
                    "unit": "steps" if figure == "break-even steps" else "CPU s",
                    "peer": peer,
                    "peer_value": None if peer_value is None else round(peer_value, 3),
                    "ratio": None if ratio is None else round(ratio, 3),
                    "target": target,
                    "met": met,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
