"""The mission's pipe against a real small judge: the embedded model (SmolLM2-135M-Instruct, greedy,
transformers on the CPU) served as an OpenAI-compatible endpoint by tests/openai_server.py, asked by
`farm-annotate --pool single` on 8 pairs, then the identical command again. A model this small often
writes a reply no parser can read; those replies are cached as unreadable, so the rerun must send 0
requests (issue 35: before, 8 pairs took 17 requests, 4 got no verdict, and the rerun sent 14 more).

    python bench/annotate_real_judge.py [--pairs 8]

Prints one JSON line per run: requests the server answered, pairs with a verdict, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))


def judge(model, tokenizer):
    """The reply of the model to a chat request, greedy, within the request's max_tokens."""
    import torch

    def respond(body: dict) -> str:
        prompt = tokenizer.apply_chat_template(
            body["messages"], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(
                **ids, max_new_tokens=int(body.get("max_tokens") or 64), do_sample=False
            )
        return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    return respond


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    from bench_annotate import alpaca_pairs
    from openai_server import OpenAIServer

    from farmkit.lm.models import load_causal_lm

    model, tokenizer = load_causal_lm("embedded", device="cpu")
    pairs = alpaca_pairs(args.pairs) or [
        {
            "instruction": f"Name a colour ({i}).",
            "output_1": "Red.",
            "output_2": f"Blue, like the sky {i}.",
        }
        for i in range(args.pairs)
    ]
    data = "".join(json.dumps(pair) + "\n" for pair in pairs).encode()
    with (
        tempfile.TemporaryDirectory() as folder,
        OpenAIServer(respond=judge(model, tokenizer), serial=True) as server,
    ):
        env = {**os.environ, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-local"}
        command = [
            str(Path(sys.executable).parent / "farm-annotate"),
            "--pool",
            "single",
            "--cache",
            str(Path(folder) / "cache.sqlite"),
            "--timeout",
            "120",
        ]
        for run in ("first", "identical rerun"):
            before, started = sum(server.outcomes.values()), time.perf_counter()
            done = subprocess.run(command, input=data, capture_output=True, env=env, check=True)
            records = [json.loads(line) for line in done.stdout.splitlines()]
            print(
                json.dumps(
                    {
                        "benchmark": "annotate-real-judge",
                        "run": run,
                        "pairs": len(records),
                        "requests": sum(server.outcomes.values()) - before,
                        "with_verdict": sum(r["preference"] is not None for r in records),
                        "seconds": round(time.perf_counter() - started, 1),
                        "summary": done.stderr.decode().strip().splitlines(),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
