"""n samples per prompt from one prefill (the default) against n prefills (FARMKIT_SHARED_PREFILL=0,
what transformers' num_return_sequences does): CPU seconds of farmkit.lm.generation.generate at the
pipeline's settings, in one process, the two ways interleaved (A B A B ...), so that the machine's
load weighs on both alike.

The prompts are the demo's own (examples/data/instructions.jsonl, the first BENCH_PREFILL_PROMPTS,
16) in the embedded model's template; the settings are examples/sizes.mk's: temperature 1.0 and 32
new tokens, a generation batch of 32 sequences, n = 2 (the pairs farm-sample draws for annotation),
4 (the demo's best-of-n and expert iteration) and 8 (the study's). Each way is timed
BENCH_PREFILL_ROUNDS (2) times per n after one warm-up call of each, with one torch thread
(BENCH_PREFILL_THREADS); the figure is the CPU time (user + system of this process, every thread)
summed over the rounds. Both ways draw with the same seed: the share of samples whose text is the
same both ways is printed too (the random numbers are the same; only floating-point rounding, a
batch of B rows against n x B, can move a draw).

    python bench/bench_prefill.py
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
    import torch

    from farmkit.lm.generation import DecodingConfig, generate
    from farmkit.lm.models import PromptFormat, load_causal_lm, resolve

    torch.set_num_threads(int(os.environ.get("BENCH_PREFILL_THREADS", "1")))
    count = int(os.environ.get("BENCH_PREFILL_PROMPTS", "16"))
    rounds = int(os.environ.get("BENCH_PREFILL_ROUNDS", "2"))
    ns = [int(n) for n in os.environ.get("BENCH_PREFILL_NS", "2,4,8").split(",")]
    path = resolve("embedded")
    model, tokenizer = load_causal_lm(path, device="cpu")
    prompt_format = PromptFormat.for_model(path)
    lines = (ROOT / "examples" / "data" / "instructions.jsonl").read_text().splitlines()[:count]
    prompts = [prompt_format.record_prompt(tokenizer, json.loads(line)) for line in lines]
    prompt_tokens = sum(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)

    def run(shared: bool, n: int, seed: int) -> tuple[float, list]:
        os.environ["FARMKIT_SHARED_PREFILL"] = "1" if shared else "0"
        config = DecodingConfig(n=n, temperature=1.0, max_new_tokens=32, batch_size=32)
        started = cpu_seconds()
        samples = generate(model, tokenizer, prompts, config, seed=seed)
        return cpu_seconds() - started, samples

    for n in ns:
        run(True, n, 99)  # warm-up: allocator, kernels
        run(False, n, 99)
        spent = {True: 0.0, False: 0.0}
        same = total = 0
        for r in range(rounds):
            texts = {}
            for shared in (False, True) if r % 2 == 0 else (True, False):
                seconds, samples = run(shared, n, r)
                spent[shared] += seconds
                texts[shared] = [s.text for per_prompt in samples for s in per_prompt]
            same += sum(a == b for a, b in zip(texts[True], texts[False], strict=True))
            total += len(texts[True])
        ratio = spent[True] / spent[False]
        print(
            json.dumps(
                {
                    "benchmark": "prefill",
                    "figure": (
                        f"generate n={n}, {count} prompts ({prompt_tokens / count:.0f} tokens each), "
                        f"32 new tokens, T=1: CPU s of one prefill per prompt against n "
                        f"({rounds} rounds each, interleaved; same text {same} of {total})"
                    ),
                    "value": spent[True],
                    "unit": "CPU s",
                    "peer": "n prefills",
                    "peer_value": spent[False],
                    "ratio": ratio,
                    "target": "< 1",
                    "met": ratio < 1,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
