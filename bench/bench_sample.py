"""Throughput of farm-sample's `hf` backend: batched generation (length buckets, left padding) against
one prompt at a time, on the same prompts with the embedded model, in one run (target: >= 5x).

Greedy decoding, so both ways produce (nearly) the same tokens; only completion tokens are counted,
so batching gets no credit for the padding steps it spends on sequences that already ended.
Also prints the embedded model's load time. `BENCH_SAMPLE_PROMPTS` (32), `BENCH_SAMPLE_TOKENS` (48)
and `BENCH_SAMPLE_THREADS` (1: on a shared machine, two threads per process spin against each other
and slow both ways down several times) change the set-up.

On a GPU machine with vLLM installed, compare the backends end to end on the same file instead:
    farm-sample embedded prompts.jsonl --backend hf   --batch-size 64 -o hf.jsonl
    farm-sample embedded prompts.jsonl --backend vllm -o vllm.jsonl
(each prints its tokens/s on stderr when it finishes).
"""

from __future__ import annotations

import json
import os
import time

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


def main() -> None:
    import torch

    from farmkit.lm.generation import DecodingConfig, generate
    from farmkit.lm.models import PromptFormat, load_causal_lm, resolve

    torch.set_num_threads(int(os.environ.get("BENCH_SAMPLE_THREADS", "1")))
    count = int(os.environ.get("BENCH_SAMPLE_PROMPTS", "32"))
    new_tokens = int(os.environ.get("BENCH_SAMPLE_TOKENS", "48"))
    path = resolve("embedded")
    started = time.perf_counter()
    model, tokenizer = load_causal_lm(path, device="cpu")
    load_seconds = time.perf_counter() - started
    prompt_format = PromptFormat.for_model(path)
    instructions = [f"Write two sentences about {TOPICS[i % len(TOPICS)]}." for i in range(count)]
    prompts = [prompt_format.prompt(tokenizer, text) for text in instructions]

    def throughput(batch_size: int) -> float:
        config = DecodingConfig(temperature=0, max_new_tokens=new_tokens, batch_size=batch_size)
        begin = time.perf_counter()
        samples = generate(model, tokenizer, prompts, config)
        seconds = time.perf_counter() - begin
        return sum(group[0].completion_tokens for group in samples) / seconds

    torch.manual_seed(0)
    generate(
        model, tokenizer, prompts[:2], DecodingConfig(temperature=0, max_new_tokens=4, batch_size=2)
    )  # warm-up
    batched = throughput(count)
    single = throughput(1)
    ratio = batched / single
    print(
        json.dumps(
            {
                "benchmark": "sample",
                "figure": f"hf batched ({count} prompts) vs one at a time, embedded",
                "value": round(batched, 2),
                "unit": "tokens/s",
                "peer": "one prompt at a time",
                "peer_value": round(single, 2),
                "ratio": round(ratio, 2),
                "target": ">= 5",
                "met": ratio >= 5,
            }
        )
    )
    print(
        json.dumps(
            {
                "benchmark": "sample",
                "figure": "embedded model load time (cached folder)",
                "value": round(load_seconds, 2),
                "unit": "s",
            }
        )
    )


if __name__ == "__main__":
    main()
