"""The share of padding in the token positions that SFT, reward-model and DPO training compute, at
the demo's settings (examples/sizes.mk: batches of TRAIN_BATCH 8), on the demo's data, tokenized as
the tools tokenize it (farmkit.methods.sft.tokenize_examples, the reward model's texts through
farmkit.train.scoring, farmkit.methods.dpo.pair_rows) with the embedded model's tokenizer.

A batch is padded to its longest row: farm-sft's TRL collator pads its 8 demonstrations, farm-rm-train
its 8 pairs' 16 texts, farm-dpo TRL's 8 prompt + chosen and 8 prompt + rejected rows. The share is
1 - real tokens / (rows x longest row), over every batch of BENCH_PADDING_EPOCHS (20) shuffles of the
data into batches (the tools draw theirs at random). The SFT data are the demo's split of the shipped
instructions (farm-split, seed 0, the demo's sizes); the reward model's and DPO's need the demo's
sampled and annotated pairs: the preferences.jsonl of a demo run (BENCH_PADDING_RUN, default
examples/runs/demo), skipped when there is none. These shares are arithmetic on token counts.

Then the time it costs: farm-sft's step (forward and backward of the causal LM loss on the responses)
on the embedded model, one torch thread, on BENCH_PADDING_BATCHES (2) random batches of the demo's
demonstrations, padded (the default) against padding-free (FARMKIT_PACKED_SFT=1: one row, positions
restarting at each demonstration, as TRL's collator builds it), interleaved, after one warm-up pass,
BENCH_PADDING_ROUNDS (2) rounds: CPU seconds (user + system) summed; the ratio is packed / padded.
The largest difference between the two ways' logits on the real tokens is printed too.

    python bench/bench_padding.py
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 8  # examples/sizes.mk TRAIN_BATCH, demo
EPOCHS = int(os.environ.get("BENCH_PADDING_EPOCHS", "20"))


def padding_share(lengths: list[int], batch: int, epochs: int, seed: int = 0) -> tuple[float, int]:
    """(padding / computed positions, batches) over `epochs` random orders cut into batches."""
    draw = random.Random(seed)
    real = computed = batches = 0
    for _ in range(epochs):
        order = list(range(len(lengths)))
        draw.shuffle(order)
        for start in range(0, len(order), batch):
            rows = [lengths[i] for i in order[start : start + batch]]
            real += sum(rows)
            computed += len(rows) * max(rows)
            batches += 1
    return 1 - real / computed, batches


def paired_share(pairs: list[tuple[int, int]], batch: int, epochs: int) -> tuple[float, int]:
    """The same for batches whose rows are both sides of each pair, padded together."""
    draw = random.Random(0)
    real = computed = batches = 0
    for _ in range(epochs):
        order = list(range(len(pairs)))
        draw.shuffle(order)
        for start in range(0, len(order), batch):
            rows = [length for i in order[start : start + batch] for length in pairs[i]]
            real += sum(rows)
            computed += len(rows) * max(rows)
            batches += 1
    return 1 - real / computed, batches


def sft_examples() -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [
                str(Path(sys.executable).parent / "farm-split"),
                str(ROOT / "examples" / "data" / "instructions.jsonl"),
                "-o",
                folder,
                "--sizes",
                "sft=300,pref=40,unlabeled=24,val=20",
                "--seed",
                "0",
                "-q",
            ],
            check=True,
        )
        return [json.loads(line) for line in open(Path(folder) / "sft.jsonl")]


def emit(figure: str, share: float, batches: int, unit_note: str) -> None:
    print(
        json.dumps(
            {
                "benchmark": "padding",
                "figure": figure,
                "value": round(100 * share, 2),
                "unit": "% padding",
                "peer": unit_note,
                "peer_value": batches,
                "ratio": round(1 / (1 - share), 3),
                "target": "<= 15% (else pack)",
                "met": share <= 0.15,
            }
        )
    )


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def time_sft_step(path, tokenizer, rows: list[dict]) -> None:
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from farmkit.lm.models import load_causal_lm

    torch.set_num_threads(1)
    model, _ = load_causal_lm(path, device="cpu", dtype="float32")
    draw = random.Random(1)
    chosen = [
        draw.sample(rows, BATCH) for _ in range(int(os.environ.get("BENCH_PADDING_BATCHES", "2")))
    ]
    ways = {
        "padded": DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id),
        "packed": DataCollatorForLanguageModeling(
            pad_token_id=tokenizer.pad_token_id, padding_free=True
        ),
    }
    model.eval()
    with torch.no_grad():  # the same logits on the real tokens
        batch = chosen[0]
        wide = model(**ways["padded"](batch), use_cache=False).logits
        flat = model(**ways["packed"](batch), use_cache=False).logits[0]
        start, largest = 0, 0.0
        for row, item in enumerate(batch):
            n = len(item["input_ids"])
            largest = max(largest, float((wide[row, :n] - flat[start : start + n]).abs().max()))
            start += n
    model.train()
    spent = {name: 0.0 for name in ways}
    rounds = int(os.environ.get("BENCH_PADDING_ROUNDS", "2"))
    for index in range(rounds + 1):
        for batch in chosen:
            for name, collate in ways.items():
                inputs = collate(batch)
                model.zero_grad(set_to_none=True)
                start_time = cpu_seconds()
                model(**inputs, use_cache=False).loss.backward()
                if index:  # the first pass is a warm-up
                    spent[name] += cpu_seconds() - start_time
    steps = rounds * len(chosen)
    print(
        json.dumps(
            {
                "benchmark": "padding",
                "figure": "SFT forward + backward, packed (per batch of 8)",
                "value": round(spent["packed"] / steps, 3),
                "unit": "CPU s",
                "peer": "padded",
                "peer_value": round(spent["padded"] / steps, 3),
                "ratio": round(spent["packed"] / spent["padded"], 3),
                "target": "< 1",
                "met": spent["packed"] < spent["padded"],
            }
        ),
        flush=True,
    )
    print(
        json.dumps(
            {
                "benchmark": "padding",
                "figure": "largest logit difference, packed - padded, real tokens",
                "value": largest,
                "unit": "",
                "peer": "largest logit",
                "peer_value": float(wide.abs().max()),
                "ratio": largest / float(wide.abs().max()),
                "target": "<= 1e-5",
                "met": largest / float(wide.abs().max()) <= 1e-5,
            }
        ),
        flush=True,
    )


def main() -> None:
    from farmkit.lm.models import PromptFormat, load_tokenizer, resolve
    from farmkit.methods.dpo import pair_rows
    from farmkit.methods.sft import tokenize_examples
    from farmkit.train.scoring import reward_format, reward_text, tail_token_ids

    path = resolve("embedded")
    tokenizer = load_tokenizer(path, padding_side="right")
    fmt = PromptFormat.for_model(path, "auto")
    rows = tokenize_examples(tokenizer, fmt, sft_examples(), 512)
    share, batches = padding_share([len(r["input_ids"]) for r in rows], BATCH, EPOCHS)
    emit("SFT batch padding (demo split, 8 a batch)", share, batches, "batches")
    time_sft_step(path, tokenizer, rows)

    run = Path(os.environ.get("BENCH_PADDING_RUN", ROOT / "examples" / "runs" / "demo"))
    prefs_file = run / "preferences.jsonl"
    if not prefs_file.exists():
        print(f"no {prefs_file}: reward-model and DPO padding skipped", file=sys.stderr)
        return
    prefs = [json.loads(line) for line in open(prefs_file)]
    rm_fmt = reward_format(path, tokenizer)
    sides = [
        tail_token_ids(
            tokenizer,
            [
                reward_text(tokenizer, rm_fmt, p["instruction"], p.get("input"), p[key])
                for p in prefs
            ],
            512,
        )
        for key in ("output_1", "output_2")
    ]
    share, batches = paired_share(
        [(len(a), len(b)) for a, b in zip(*sides, strict=True)], BATCH, EPOCHS
    )
    emit("reward-model batch padding (demo pairs, 8 pairs a batch)", share, batches, "batches")
    decided = [
        {**p, "chosen": p["output_1"], "rejected": p["output_2"]}
        for p in prefs
        if p.get("preference") in (1, 2, 1.0, 2.0)
    ]
    dpo = pair_rows(tokenizer, fmt, decided, 512)
    share, batches = paired_share(
        [
            (
                len(r["prompt_ids"]) + len(r["chosen_ids"]),
                len(r["prompt_ids"]) + len(r["rejected_ids"]),
            )
            for r in dpo
        ],
        BATCH,
        EPOCHS,
    )
    emit("DPO batch padding (demo pairs, 8 pairs a batch)", share, batches, "batches")


if __name__ == "__main__":
    main()
