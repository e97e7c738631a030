"""Audit of --max-cost (not a test): many capped farm-annotate runs against the loopback server
(tests/openai_server.py), with fresh random cases, and what the server billed each run priced
against its cap.

    .venv/bin/python bench/audit_money.py [--runs 16] [--seed 7] [--src DIR]

Each case draws: the scripts of the texts (Latin, CJK, Cyrillic, emoji, code and digits, mixed in the
order they come, denser text later), how the server bills (words, a token per character, a token per
UTF-8 byte, the embedded model's real tokenizer), whether replies report usage (always, never, half),
how long the replies are (a verdict plus a rationale the judge's max_tokens cuts), timeouts the
server bills all the same, the concurrency, the batch size, and the cap (a fraction of what the same
run costs uncapped). Some cases run two processes at once on one cache, each with its own key and
the same cap: each process's bill (the server keeps one per key) must stay under the cap.

`--src DIR` runs farmkit from another tree (e.g. the unfixed code, `git archive HEAD | tar -x`).
Prints one line per capped run and a summary: runs over the cap and the worst spend / cap.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from openai_server import OpenAIServer, count_tokens, judge_longer  # noqa: E402

PRICE = 1000.0  # USD per million tokens, prompt and completion alike: spends of a few dollars

LATIN = "the quick answer covers every case and explains why it holds in practice".split()
CYRILLIC = "быстрый ответ охватывает каждый случай и объясняет почему это верно".split()
CJK = "这个答案涵盖了所有情况并解释了原因我们认为它是正确的"
EMOJI = "😀🎉🚀🌍🔥✨💡🧪📈🤖"
CODE = ["x[3]=0x7f;", "for(i=0;i<99;i++){s+=a[i]*2;}", "0123456789", "if(a!=b)&&(c<=d)", "#!$%^&*"]


def text(rng: random.Random, script: str, words: int) -> str:
    if script == "latin":
        return " ".join(rng.choice(LATIN) for _ in range(words))
    if script == "cyrillic":
        return " ".join(rng.choice(CYRILLIC) for _ in range(words))
    if script == "cjk":
        return "".join(rng.choice(CJK) for _ in range(words * 2))
    if script == "emoji":
        return " ".join(rng.choice(EMOJI) + rng.choice(LATIN) for _ in range(words))
    return " ".join(rng.choice(CODE) for _ in range(words))


def pairs(rng: random.Random, n: int, scripts: list[str]) -> bytes:
    lines = []
    for i in range(n):
        script = scripts[min(len(scripts) - 1, i * len(scripts) // n)]  # denser scripts later
        a, b = text(rng, script, rng.randint(3, 20)), text(rng, script, rng.randint(3, 60))
        lines.append(
            orjson.dumps(
                {"instruction": f"Q{i} " + text(rng, script, 5), "output_1": a, "output_2": b}
            )
        )
    return b"\n".join(lines) + b"\n"


def real_tokenizer():
    from tokenizers import Tokenizer

    from farmkit.lm.models import resolve

    tokenizer = Tokenizer.from_file(str(Path(resolve("embedded")) / "tokenizer.json"))
    return lambda s: len(tokenizer.encode(s, add_special_tokens=False).ids)


def billing(kind: str):
    if kind == "words":
        return count_tokens
    if kind == "chars":
        return len
    if kind == "bytes":
        return lambda s: len(s.encode())
    counted = real_tokenizer()
    return lambda s: counted(s) + 5  # and the chat template's markers around each message


def responder(rng_seed: int, rationale: int):
    """judge_longer, with a rationale of up to `rationale` words after the verdicts."""
    rng = random.Random(rng_seed)

    def respond(body):
        verdicts = judge_longer(body)
        words = rng.randint(0, rationale)
        return verdicts + (
            "\n" + " ".join(rng.choice(LATIN) for _ in range(words)) if words else ""
        )

    return respond


def run(src, pool, prices, data, env, cap, cache, procs=1, extra=()):
    command = [sys.executable, "-c", "from farmkit.tools.farm_annotate import cli; cli()"]
    args = ["--pool", str(pool), "--prices", str(prices), "-q", *extra]
    args += ["--cache", str(cache)] if cache else ["--no-cache"]
    if cap is not None:
        args += ["--max-cost", f"{cap:.6f}"]
    base = dict(os.environ, **env)
    if src:
        base["PYTHONPATH"] = src
    running = []
    for p in range(procs):
        running.append(
            subprocess.Popen(
                command + args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(base, OPENAI_API_KEY=f"audit-key-{p}"),
                cwd=src or ROOT,  # python -c puts the working directory first on sys.path
            )
        )
    outs = [process.communicate(data, timeout=600) for process in running]
    return [
        (process.returncode, out, err) for process, (out, err) in zip(running, outs, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--src")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    over, worst, used = 0, 0.0, []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prices = tmp / "prices.yaml"
        prices.write_text(f"audit-model: {{prompt: {PRICE}, completion: {PRICE}}}\n")
        for case in range(args.runs):
            scripts = rng.sample(["latin", "cyrillic", "cjk", "emoji", "code"], rng.randint(1, 3))
            bill = rng.choice(["words", "chars", "bytes", "real"])
            usage = rng.choice(
                [0.0, 0.5, 1.0, -1.0]
            )  # share of replies without usage (-1: the later 2/3)
            timeouts = rng.choice([0.0, 0.0, 0.1])
            concurrency = rng.choice([1, 4, 8, 16])
            batch = rng.choice([1, 1, 2, 4])
            max_tokens = rng.choice([20, 40, 80])
            rationale = rng.choice([0, 10, 60])
            fraction = rng.uniform(0.0, 1.0)
            procs = rng.choice([1, 1, 2])
            n = rng.randint(30, 60)
            pool = tmp / f"pool{case}.yaml"
            pool.write_text(
                "name: audit\nflip_rate: 0.0\n"
                f"settings: {{concurrency: {concurrency}, timeout: 1.0, backoff: 0.02, "
                "max_retries: 3, parse_retries: 1}\n"
                "judges:\n"
                f"  - {{name: j, backend: openai, model: audit-model, prompt: plain, "
                f"batch_size: {batch}, temperature: 0.0, max_tokens: {max_tokens}}}\n"
            )
            data = pairs(rng, n, scripts)
            faults = {"null_usage": usage} if usage > 0 else {}
            script = [None] * (n // 3) + ["null_usage"] * (4 * n) if usage < 0 else None
            if timeouts:
                faults["timeout"] = timeouts

            def server(case=case, rationale=rationale, faults=faults, bill=bill, script=script):
                return OpenAIServer(
                    respond=responder(case, rationale),
                    latency=0.01,
                    faults=faults,
                    billing=billing(bill),
                    hang=1.3,
                    seed=case,
                    script=script,
                )

            def priced(billed):
                return sum(p + c for p, c in billed) * PRICE / 1e6

            with server() as s:
                run(args.src, pool, prices, data, {"OPENAI_BASE_URL": s.url}, None, None)
                full = priced(s.billed)
            estimate = orjson.loads(
                run(
                    args.src,
                    pool,
                    prices,
                    data,
                    {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
                    None,
                    None,
                    extra=["--estimate"],
                )[0][1]
            )["price"]
            # a cap the pre-flight estimate lets through (else nothing is asked at all), under the full spend
            low = max(estimate * 1.001, 0.2 * full)
            if low >= 0.95 * full:
                print(
                    f"case {case:2d} skipped: the estimate {estimate:.4f} is above 95% of the spend {full:.4f}"
                )
                continue
            cap = low + fraction * (0.95 * full - low)
            with server() as s:
                results = run(
                    args.src,
                    pool,
                    prices,
                    data,
                    {"OPENAI_BASE_URL": s.url},
                    cap,
                    tmp / f"cache{case}.sqlite" if procs > 1 else None,
                    procs,
                )
                spends = [priced(s.billed_by.get(f"audit-key-{p}", [])) for p in range(procs)]
            for (code, _, err), spent in zip(results, spends, strict=True):
                ratio = spent / cap
                worst = max(worst, ratio)
                over += ratio > 1 + 1e-9
                used.append(ratio)
                status = "OVER" if ratio > 1 + 1e-9 else "ok"
                print(
                    f"case {case:2d} {'+'.join(scripts):22s} bill={bill:5s} no-usage={usage:.1f} "
                    f"timeouts={timeouts:.1f} c={concurrency:2d} batch={batch} max_tokens={max_tokens:2d} "
                    f"procs={procs} cap={cap:8.4f} spent={spent:8.4f} ratio={ratio:5.3f} exit={code} {status}"
                    + (f" stderr={err.decode()[-200:]!r}" if code else ""),
                    flush=True,
                )
    print(
        f"SUMMARY: {over} of {len(used)} capped runs over the cap; worst spend/cap {worst:.3f}; "
        f"median spend/cap {sorted(used)[len(used) // 2]:.3f}"
    )


if __name__ == "__main__":
    main()
