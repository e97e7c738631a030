"""torch's fused AdamW (farmkit's default: farmkit.train.policy.adamw and `optim="adamw_torch_fused"`
for farm-sft and farm-dpo) against the per-tensor loop torch runs on the CPU without it
(FARMKIT_FUSED_ADAMW=0): CPU seconds per optimizer step and per whole training step on the embedded
model (135M parameters, float32), in one process, the two ways interleaved (A B A B ...) so that the
machine's load weighs on both alike, with one torch thread (BENCH_OPTIM_THREADS) as the pipeline runs.

The optimizer step: both optimizers hold their own state over the same parameters and step on the
same gradients (the first training step's); BENCH_OPTIM_ROUNDS (6) timed steps of each after one
warm-up step each. The whole step: forward, backward and the optimizer step on a batch of 8 of the
demo's demonstrations (the first 8 of examples/data/instructions.jsonl, in the embedded model's
template, the causal LM loss on every token), BENCH_OPTIM_STEP_ROUNDS (4) steps of each way. The
figure is CPU time (user + system of this process) summed over the rounds; the ratio is fused over
the loop. Also printed: the largest difference between the weights the two ways reach from the same
start in 3 steps on the same gradients (float tolerance).

    python bench/bench_optim.py
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


def emit(figure: str, value: float, peer_value: float, unit: str = "CPU s") -> None:
    print(
        json.dumps(
            {
                "benchmark": "optim",
                "figure": figure,
                "value": round(value, 3),
                "unit": unit,
                "peer": "per-tensor loop",
                "peer_value": round(peer_value, 3),
                "ratio": round(value / peer_value, 3),
                "target": "< 1",
                "met": value < peer_value,
            }
        ),
        flush=True,
    )


def main() -> None:
    import torch

    from farmkit.lm.models import PromptFormat, load_causal_lm, resolve

    torch.set_num_threads(int(os.environ.get("BENCH_OPTIM_THREADS", "1")))
    rounds = int(os.environ.get("BENCH_OPTIM_ROUNDS", "6"))
    step_rounds = int(os.environ.get("BENCH_OPTIM_STEP_ROUNDS", "4"))
    path = resolve("embedded")
    model, tokenizer = load_causal_lm(path, device="cpu", dtype="float32")
    model.train()
    tokenizer.padding_side = "right"
    fmt = PromptFormat.for_model(path, "auto")
    examples = [
        json.loads(line) for line in open(ROOT / "examples" / "data" / "instructions.jsonl")
    ][:8]
    texts = [
        fmt.prompt(tokenizer, e["instruction"], e.get("input")) + e["output"] for e in examples
    ]
    batch = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    params = [p for p in model.parameters() if p.requires_grad]
    options = {"lr": 1e-5, "weight_decay": 0.01}
    fused = torch.optim.AdamW(params, fused=True, **options)
    loop = torch.optim.AdamW(params, foreach=False, **options)  # torch's CPU default
    ways = {"fused": fused, "loop": loop}

    def forward_backward() -> None:
        model.zero_grad(set_to_none=False)
        model(**batch, labels=labels).loss.backward()

    forward_backward()
    grads = [p.grad.clone() for p in params]
    spent = {name: 0.0 for name in ways}
    for index in range(rounds + 1):
        for name, optimizer in ways.items():
            for p, g in zip(params, grads, strict=True):
                p.grad.copy_(g)
            start = cpu_seconds()
            optimizer.step()
            if index:  # the first is a warm-up
                spent[name] += cpu_seconds() - start
    emit("AdamW step, 135M parameters (per step)", spent["fused"] / rounds, spent["loop"] / rounds)

    steps = {name: 0.0 for name in ways}
    for _ in range(step_rounds):
        for name, optimizer in ways.items():
            start = cpu_seconds()
            forward_backward()
            optimizer.step()
            steps[name] += cpu_seconds() - start
    emit(
        "training step, batch of 8 (forward, backward, AdamW; per step)",
        steps["fused"] / step_rounds,
        steps["loop"] / step_rounds,
    )

    # the same update: from one start, 3 steps each way on the same gradients
    start_weights = [p.detach().clone() for p in params]
    reached = {}
    for name in ways:
        for p, w in zip(params, start_weights, strict=True):
            p.data.copy_(w)
        optimizer = torch.optim.AdamW(
            params, fused=name == "fused", foreach=False if name == "loop" else None, **options
        )
        for _ in range(3):
            for p, g in zip(params, grads, strict=True):
                p.grad.copy_(g)
            optimizer.step()
        reached[name] = [p.detach().clone() for p in params]
        del optimizer
    largest = max(
        float((a - b).abs().max()) for a, b in zip(reached["fused"], reached["loop"], strict=True)
    )
    tolerance = 1e-6  # weights of the order of 1: a float32 step there is 1.2e-7
    print(
        json.dumps(
            {
                "benchmark": "optim",
                "figure": "largest weight difference, fused - loop, after 3 steps",
                "value": largest,
                "unit": "",
                "peer": "tolerance",
                "peer_value": tolerance,
                "ratio": largest / tolerance,
                "target": "<= 1",
                "met": largest <= tolerance,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
