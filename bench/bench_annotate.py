"""farm-annotate against a local OpenAI-compatible server (tests/openai_server.py, in its own process)
with a fixed per-request latency:

- throughput: requests/s with concurrency C against the limit C / latency (target >= 90% at an
  API-like latency of 500 ms and at a 100 ms stress point), without the verdict cache and with it
  (a new cache file: every request reads the cache, claims its question, writes the verdict);
- prompt tokens per pair (as the server counts them) at batch size 5 against batch size 1, with 5, 3
  and 0 worked examples, on AlpacaEval's long outputs and on Alpaca-length short ones (target <= 40%,
  checked at 5 examples: the setting of the pools' two batch-5 judges; batching saves the shared
  instructions and examples, so a bare prompt, whose tokens are nearly all pair text, saves little);
- a fully cached rerun of 10,000 pairs, the whole command timed from process start (target < 2 s);
- pairs/s against AlpacaEval's annotator at its default settings on the same server (target >= 3x),
  when bench/out/alpaca-eval-venv holds alpaca-eval (see bench/alpaca_eval_peer.py);
- direct against --batch (`--batch-only`): the same 1,000 pairs through sim_eval's ten judges,
  asked directly and through the Batch API of the loopback fake (tests/batch_server.py, usage
  counted as its tokens), with the price and the requests sent each way.

Prints one JSON line per figure (see bench/run.py). Pairs are real model outputs from
../shared/data/alpaca_eval when present, else generated text of similar length.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
SHARED = Path(os.environ.get("FARMKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
# (latency s, concurrency, requests, cache): a realistic API setting and a stress setting, both with
# the target, without the verdict cache and with it (the default path)
THROUGHPUT = (
    (0.5, 16, 480, False),
    (0.1, 16, 480, False),
    (0.5, 16, 480, True),
    (0.1, 16, 480, True),
)
CACHED_PAIRS = 10_000
PEER_LATENCY, PEER_PAIRS = 0.5, 200


def alpaca_pairs(n: int) -> list[dict]:
    """Pairs of short, Alpaca-length answers (real Alpaca demonstrations; content does not matter for token counts)."""
    path = SHARED / "alpaca" / "alpaca_cleaned_first1000.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())
    return [
        {
            "instruction": rows[i]["instruction"],
            "output_1": rows[i]["output"],
            "output_2": rows[i + 1]["output"],
        }
        for i in range(min(n, len(rows) - 1))
    ]


def real_pairs(n: int) -> list[dict]:
    folder = SHARED / "alpaca_eval" / "model_outputs"
    first, second = folder / "text_davinci_003.jsonl.gz", folder / "gpt4.jsonl.gz"
    pairs: list[dict] = []
    if first.exists() and second.exists():
        with gzip.open(first) as a, gzip.open(second) as b:
            reference = {r["instruction"]: r["output"] for r in map(json.loads, a)}
            for record in map(json.loads, b):
                if record["instruction"] in reference:
                    pairs.append(
                        {
                            "instruction": record["instruction"],
                            "output_1": reference[record["instruction"]],
                            "output_2": record["output"],
                        }
                    )
    if not pairs:
        filler = (
            "This answer explains the point step by step with an example and a short conclusion. "
        )
        pairs = [
            {
                "instruction": f"Explain topic {i} to a beginner.",
                "output_1": filler * 4,
                "output_2": filler * 6,
            }
            for i in range(800)
        ]
    # distinct pairs beyond the data's size: the same texts under numbered instructions
    return [
        {**pairs[i % len(pairs)], "instruction": f"{pairs[i % len(pairs)]['instruction']} (#{i})"}
        for i in range(n)
    ]


def start_server(latency: float, reply: str | None = None) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, str(ROOT / "tests" / "openai_server.py"), "--latency", str(latency)]
    process = subprocess.Popen(
        command + (["--reply", reply] if reply else []), stdout=subprocess.PIPE, text=True
    )
    return process, process.stdout.readline().strip()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc (0 where /proc is absent)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pool_file(folder: Path, name: str, batch_size: int, examples: int, concurrency: int) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(
        json.dumps(
            {
                "name": name,
                "description": "benchmark judge",
                "tiers": {"large": "bench-model"},
                "settings": {"concurrency": concurrency, "timeout": 30, "backoff": 0.1},
                "judges": [
                    {
                        "name": name,
                        "backend": "openai",
                        "tier": "large",
                        "prompt": "plain",
                        "batch_size": batch_size,
                        "examples": examples,
                        "temperature": 0.0,
                        "max_tokens": 60,
                    }
                ],
            }
        )
    )
    return str(path)


def timed_run(pool: str, pairs: list[dict], cache: str | None) -> tuple[float, object]:
    """Annotate in this process (imports already paid), returning seconds and the run's stats."""
    from farmkit.annotate.pairs import Item
    from farmkit.annotate.pools import load_pool
    from farmkit.annotate.run import Run

    items = [Item({"input": "", **p}) for p in pairs]
    with Run(load_pool(pool), cache_path=cache) as run:
        started = time.perf_counter()
        records = list(run.records(items))
        elapsed = time.perf_counter() - started
    assert len(records) == len(pairs) and all(r["preference"] is not None for r in records)
    return elapsed, run.annotator.stats


def alpaca_eval_comparison(folder: Path) -> None:
    """Pairs/s of AlpacaEval's annotator at its defaults against farm-annotate's on the same server,
    when the peer's own environment exists (bench/out/alpaca-eval-venv with `pip install alpaca-eval`)."""
    from farmkit.annotate.pools import DEFAULT_SETTINGS

    peer_python = ROOT / "bench" / "out" / "alpaca-eval-venv" / "bin" / "python"
    if not peer_python.exists():
        print("alpaca-eval comparison skipped: no bench/out/alpaca-eval-venv", file=sys.stderr)
        return
    pairs = real_pairs(PEER_PAIRS)
    path = folder / "peer-pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    reply = "[{'model': 'model_1', 'rank': 1}, {'model': 'model_2', 'rank': 2}]"  # the peer's ranking format
    server, url = start_server(PEER_LATENCY, reply)
    os.environ["OPENAI_BASE_URL"] = url
    try:
        peer = subprocess.run(
            [str(peer_python), str(ROOT / "bench" / "alpaca_eval_peer.py"), str(path)],
            env={**os.environ, "OPENAI_API_BASE": url},
            capture_output=True,
            text=True,
        )
        assert peer.returncode == 0, peer.stderr[-2000:]
        figures = json.loads(peer.stdout.strip().splitlines()[-1])
        # the peer gives identical outputs a draw without asking, so a few pairs may not be "parsed"
        assert figures["parsed"] >= 0.95 * len(pairs), figures
        peer_rate = len(pairs) / figures["seconds"]
        single = pool_file(folder, "default-b1", 1, 0, DEFAULT_SETTINGS["concurrency"])
        for label, pool in (
            ("one judge, batch 1", single),
            ("sim_eval pool, batches of 1-5", "sim_eval"),
        ):
            seconds, _ = timed_run(pool, pairs, None)
            rate = len(pairs) / seconds
            emit(
                figure=f"pairs/s at defaults, {label}, latency {PEER_LATENCY * 1000:.0f} ms",
                value=rate,
                unit="pairs/s",
                peer="alpaca-eval 0.6.6 (alpaca_eval_gpt4, defaults)",
                peer_value=peer_rate,
                ratio=rate / peer_rate,
                target=">= 3",
                met=rate / peer_rate >= 3,
                load_average=os.getloadavg()[0],
            )
    finally:
        server.terminate()
        server.wait()


def emit(**row: object) -> None:
    print(json.dumps({"benchmark": "annotate", **row}), flush=True)


def main() -> None:
    import argparse

    import httpx  # noqa: F401 - imported before timing, as in a long-running process

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--throughput-only",
        action="store_true",
        help="only the throughput points (500 and 100 ms, without and with the cache)",
    )
    parser.add_argument(
        "--batch-only", action="store_true", help="only direct against --batch (1,000 pairs)"
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-annotate-"))
    if args.batch_only:
        batch_against_direct(folder)
        return
    throughput(folder)
    if args.throughput_only:
        return
    token_counts(folder)
    alpaca_eval_comparison(folder)
    cached_rerun(folder)


def batch_against_direct(folder: Path, count: int = 1000) -> None:
    """The same pairs, sim_eval's judges, directly and through the Batch API: price and requests."""
    from batch_server import BatchServer

    from farmkit.annotate.batch import BatchConfig
    from farmkit.annotate.pairs import Item
    from farmkit.annotate.pools import load_pool
    from farmkit.annotate.run import Run

    items = [Item({"input": "", **p}) for p in real_pairs(count)]
    found = {}
    for mode in ("direct", "batch"):
        with BatchServer() as server:
            os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = server.url, "bench"
            pool = load_pool("sim_eval")
            pool.settings.update({"concurrency": 16, "backoff": 0.05})
            config = BatchConfig(batch="wait" if mode == "batch" else None)
            with Run(pool, cache_path=folder / f"{mode}.sqlite", batch=config) as run:
                records: list[dict] = []
                assert run.annotate(items, records.extend) == 0
                assert all(r["preference"] is not None for r in records)
            found[mode] = (run.annotator.stats, sum(server.calls.values()), len(server.batches))
    (direct, direct_calls, _), (batch, batch_calls, batches) = found["direct"], found["batch"]
    label = f"{count:,} pairs, sim_eval, tokens {batch.prompt_tokens:,.0f} + {batch.completion_tokens:,.0f}"
    emit(
        figure=f"price with --batch, {label}",
        value=batch.price,
        unit="USD",
        peer="the same pairs asked directly",
        peer_value=direct.price,
        ratio=batch.price / direct.price,
        target="<= 0.5",
        met=batch.price / direct.price <= 0.5 + 1e-9,
    )
    emit(
        figure=f"HTTP requests with --batch ({batches} batches), {label}",
        value=batch_calls,
        unit="requests",
        peer=f"the same pairs asked directly ({direct.requests} chat completions)",
        peer_value=direct_calls,
        ratio=batch_calls / direct_calls,
        target="-",
        met=True,
    )


def throughput(folder: Path) -> None:
    for latency, concurrency, requests, cached in THROUGHPUT:
        load = os.getloadavg()[0]
        server, url = start_server(latency)
        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = url, "bench"
        cache = str(folder / f"throughput-{latency}.sqlite") if cached else None
        label = ", cache on" if cached else ", no cache"
        try:
            cpu_before, server_before = time.process_time(), process_cpu(server.pid)
            seconds, stats = timed_run(
                pool_file(folder, "b1", 1, 0, concurrency), real_pairs(requests), cache
            )
            cpu_per_request = (time.process_time() - cpu_before) / stats.requests
            server_per_request = (process_cpu(server.pid) - server_before) / stats.requests
        finally:
            server.terminate()
            server.wait()
        limit, rate = concurrency / latency, stats.requests / seconds
        emit(
            figure=f"throughput, concurrency {concurrency}, latency {latency * 1000:.0f} ms{label}",
            value=rate,
            unit="requests/s",
            peer="limit C/latency",
            peer_value=limit,
            ratio=rate / limit,
            target=">= 0.9",
            met=rate / limit >= 0.9,
            load_average=load,
        )
        # what the client itself costs: the rate one free core could sustain, whatever the machine's load
        emit(
            figure=f"client CPU per request (latency {latency * 1000:.0f} ms{label})",
            value=cpu_per_request * 1000,
            unit="ms",
            peer="requests/s one core sustains",
            peer_value=1 / cpu_per_request,
        )
        # the test server runs on the same cores: together they bound what this machine can measure
        if server_per_request > 0:
            both = cpu_per_request + server_per_request
            emit(
                figure=f"client + server CPU per request (latency {latency * 1000:.0f} ms{label})",
                value=both * 1000,
                unit="ms",
                peer=f"requests/s {os.cpu_count()} cores sustain",
                peer_value=(os.cpu_count() or 1) / both,
                ratio=rate / ((os.cpu_count() or 1) / both),
            )


def token_counts(folder: Path) -> None:
    server, url = start_server(0.0)
    os.environ["OPENAI_BASE_URL"] = url
    try:
        for data, sample in (
            ("AlpacaEval outputs", real_pairs(100)),
            ("Alpaca-length outputs", alpaca_pairs(100)),
        ):
            if not sample:
                continue
            for examples in (5, 3, 0):
                per_pair = {}
                for batch in (1, 5):
                    pool = pool_file(folder, f"tokens{batch}-{examples}", batch, examples, 16)
                    _, stats = timed_run(pool, sample, None)
                    per_pair[batch] = stats.prompt_tokens / len(sample)
                ratio = per_pair[5] / per_pair[1]
                targeted = examples == 5
                emit(
                    figure=f"prompt tokens per pair, batch 5 vs 1, {data}, {examples} worked examples",
                    value=per_pair[5],
                    unit="tokens/pair",
                    peer="batch 1",
                    peer_value=per_pair[1],
                    ratio=ratio,
                    target="<= 0.4" if targeted else "",
                    met=(ratio <= 0.4) if targeted else None,
                )
    finally:
        server.terminate()
        server.wait()


def cached_rerun(folder: Path) -> None:
    fast, url = start_server(0.0)
    try:
        env = {**os.environ, "OPENAI_BASE_URL": url}
        many = folder / "many.jsonl"
        many.write_text("".join(json.dumps(p) + "\n" for p in real_pairs(CACHED_PAIRS)))
        pool, cache = pool_file(folder, "cached", 5, 0, 32), str(folder / "cache.sqlite")
        command = [
            str(Path(sys.executable).parent / "farm-annotate"),
            "--pool",
            pool,
            "--cache",
            cache,
            "-q",
            str(many),
        ]
        first = subprocess.run(command, env=env, capture_output=True)
        assert first.returncode == 0, first.stderr.decode()
        started, cpu_before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        second = subprocess.run(command, env=env, capture_output=True)
        seconds = time.perf_counter() - started
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (
            cpu_after.ru_stime - cpu_before.ru_stime
        )
        assert second.returncode == 0 and second.stdout == first.stdout
        emit(
            figure=f"fully cached rerun of {CACHED_PAIRS} pairs (whole command)",
            value=seconds,
            unit="s",
            peer="target",
            peer_value=2.0,
            ratio=seconds / 2.0,
            target="< 2 s",
            met=seconds < 2.0,
            cpu_seconds=cpu,
            load_average=os.getloadavg()[0],
        )
        emit(figure="cached rerun records/s", value=CACHED_PAIRS / seconds, unit="records/s")
    finally:
        fast.terminate()
        fast.wait()


if __name__ == "__main__":
    main()
