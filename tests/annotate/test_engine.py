"""farm-annotate's engine: a cache shared by concurrent processes, what a cache key holds, ties for
identical outputs, the evaluation pool, budgets and de-duplication (against tests/openai_server.py)."""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from click.testing import CliRunner
from conftest import run_tool
from farmkit.tools.farm_annotate import cli
from openai_server import OpenAIServer, judge_longer, shown_pairs

from farmkit.annotate.cache import VerdictCache
from farmkit.annotate.engine import Annotator
from farmkit.annotate.pairs import Item
from farmkit.annotate.pools import load_pool, pool_from_dict

FAST = "settings: {timeout: 5.0, backoff: 0.02, max_retries: 8, concurrency: 4}\n"


def _jsonl(records) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _records(stdout: bytes) -> list[dict]:
    return [orjson.loads(line) for line in stdout.splitlines()]


def _pairs(n: int) -> list[dict]:
    return [
        {
            "instruction": f"Question {i}?",
            "output_1": f"Answer {i}.",
            "output_2": f"Answer {i}, because " + "so " * (1 + i % 5),
        }
        for i in range(n)
    ]


def _pool_file(tmp_path: Path, source: str = "sim_eval", name: str = "pool.yaml") -> str:
    text = (
        importlib.resources.files("farmkit.annotate")
        .joinpath("pools", f"{source}.yaml")
        .read_text()
    )
    path = tmp_path / name
    path.write_text(text.replace("judges:", FAST + "judges:", 1))
    return str(path)


def _annotate(*args: str, input: bytes, env: dict) -> SimpleNamespace:
    result = CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)
    return SimpleNamespace(
        returncode=result.exit_code, stdout=result.stdout_bytes, stderr=result.stderr_bytes
    )


def _env(server: OpenAIServer) -> dict:
    return {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-test"}


# -- 1: a new cache file opened by many processes at once ----------------------------------------

# a verdict as the cache stores it (rows that are not well formed are read as missing)
ROW = {
    "choice": "A",
    "prompt_tokens": 9,
    "completion_tokens": 1,
    "price": 0.0,
    "seconds": 0.1,
    "model": "m",
}


# The trials run in a lean Python of their own (the cache module alone imported), whose forks cost
# about a millisecond: forked from a test worker that holds torch and trained models, 400 forks took
# 30 to 40 s of the suite for the same check.
_TRIALS = """
import multiprocessing, random, sys, time
from farmkit.annotate.cache import VerdictCache

ROW = ROW_LITERAL


def open_and_write(path, number, jitter, barrier, errors):
    try:
        barrier.wait()
        time.sleep(jitter)  # spreads the opens over a millisecond, where the old cache met its lock conflicts
        cache = VerdictCache(path)
        cache.put_many({f"key{number}": ROW})
        found = cache.get_many([f"key{number}"])
        cache.close()
        if found != {f"key{number}": ROW}:
            errors.put(f"process {number}: read back {found}")
    except Exception as exc:  # reported to the parent, which fails the test
        errors.put(f"process {number}: {exc}")


def main(folder, per_trial, trials):
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    jitter = random.Random(0)
    for trial in range(trials):
        path = f"{folder}/trial{trial}/c.sqlite"
        barrier = context.Barrier(per_trial)
        workers = [
            context.Process(target=open_and_write, args=(path, n, jitter.random() * 0.001, barrier, errors))
            for n in range(per_trial)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        codes = [w.exitcode for w in workers]
        failures = []
        while not errors.empty():
            failures.append(errors.get())
        cache = VerdictCache(path)
        found = len(cache.get_many(f"key{n}" for n in range(per_trial)))
        cache.close()
        if codes != [0] * per_trial or failures or found != per_trial:
            sys.exit(f"trial {trial}: exit codes {codes}, failures {failures}, {found} rows found")
    print(f"{trials} trials passed")


main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
"""


@pytest.mark.heavy
def test_many_processes_open_one_new_cache_together(tmp_path):
    """100 trials of 4 processes opening one new cache at the same moment (a barrier, then up to a
    millisecond of jitter), each writing and reading back its row: none fails, none loses a row."""
    script = tmp_path / "trials.py"
    script.write_text(_TRIALS.replace("ROW_LITERAL", repr(ROW)))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "4", "100"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "100 trials passed"


@pytest.mark.heavy
def test_concurrent_cli_runs_on_a_new_cache_all_succeed_with_identical_output(tmp_path):
    pool = _pool_file(tmp_path)
    with OpenAIServer(respond=judge_longer) as server:
        for trial in range(
            2
        ):  # many more trials of the opening itself: test_many_processes_open_one_new_cache_together
            cache = str(tmp_path / f"t{trial}.sqlite")
            runs = [
                subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "farm-annotate"),
                        "--pool",
                        pool,
                        "--cache",
                        cache,
                        "-q",
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env={**os.environ, **_env(server)},
                )
                for _ in range(4)
            ]
            outputs = _communicate(runs, _jsonl(_pairs(12)))
            assert [run.returncode for run in runs] == [0] * 4, [err.decode() for _, err in outputs]
            stripped = [[_reproducible(r) for r in _records(out)] for out, _ in outputs]
            assert all(s == stripped[0] for s in stripped)


def _communicate(runs: list[subprocess.Popen], input: bytes) -> list[tuple[bytes, bytes]]:
    """Give every run its input before waiting for any (a run reads all its input before it starts)."""
    for run in runs:
        run.stdin.write(input)
        run.stdin.close()
    return [(run.stdout.read(), run.stderr.read(), run.wait(300))[:2] for run in runs]


def _reproducible(record: dict) -> dict:
    record["provenance"]["farm-annotate"].pop("time", None)
    return record


# -- 2: what the cache key holds ------------------------------------------------------------------


def _items(n: int = 3) -> list[Item]:
    return [Item(record=p) for p in _pairs(n)]


def _keys(pool, seed: int = 0, device: str = "auto") -> list[str | None]:
    # both orders: the order shown is drawn from the seed, and the texts in the order shown are in the key
    return [
        ask.key
        for ask in Annotator(pool, seed=seed, device=device, both_orders=True).plan(_items()).asks
    ]


def _one_judge_pool(temperature: float, prompt: str = "plain", backend: str = "openai"):
    judge = {"name": "j", "backend": backend, "prompt": prompt, "temperature": temperature}
    judge.update(
        {"model": "m"} if backend == "openai" else {"model": "embedded", "prompt": "local_choice"}
    )
    return pool_from_dict({"name": "p", "judges": [judge]}, "test")


def test_the_key_holds_the_endpoint_url(monkeypatch):
    pool = _one_judge_pool(0.0)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    first = _keys(pool)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:2/v1")
    assert _keys(pool) != first


def test_the_seed_is_in_the_key_only_for_random_judges(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    greedy, sampling = _one_judge_pool(0.0), _one_judge_pool(1.0)
    assert _keys(greedy, seed=0) == _keys(greedy, seed=1)
    assert _keys(sampling, seed=0) != _keys(sampling, seed=1)


def test_the_key_holds_the_template_text_not_its_path(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    shipped = (
        importlib.resources.files("farmkit.annotate").joinpath("prompts", "plain.txt").read_text()
    )
    copies = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "plain.txt").write_text(shipped)
        copies.append(str(tmp_path / folder / "plain.txt"))
    assert (
        _keys(_one_judge_pool(0.0, copies[0]))
        == _keys(_one_judge_pool(0.0, copies[1]))
        == _keys(_one_judge_pool(0.0))
    )


def test_a_new_parser_keeps_the_keys_so_paid_verdicts_are_kept(monkeypatch):
    from farmkit.annotate import parse

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1")
    pool = _one_judge_pool(0.0)
    first = _keys(pool)
    # replies cached as unreadable are re-read by the new parser instead (tests/annotate/test_cache.py)
    monkeypatch.setattr(parse, "PARSER_VERSION", parse.PARSER_VERSION + 1)
    assert _keys(pool) == first


def test_the_local_judge_key_holds_its_device_and_dtype(embedded_path, monkeypatch):
    import torch

    # a GPU machine, pretended (a --device naming a GPU that is not there is refused)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    pool = _one_judge_pool(0.0, backend="local")
    assert _keys(pool, device="cpu") != _keys(pool, device="cuda")
    bf16 = dataclasses.replace(pool, judges=[dataclasses.replace(pool.judges[0], dtype="bfloat16")])
    assert _keys(bf16, device="cpu") != _keys(pool, device="cpu")


def test_a_second_server_under_the_same_model_name_is_asked_again(tmp_path):
    pool, cache = _pool_file(tmp_path), str(tmp_path / "c.sqlite")
    with OpenAIServer(respond=judge_longer) as first, OpenAIServer(respond=judge_longer) as second:
        assert (
            _annotate(
                "--pool", pool, "--cache", cache, input=_jsonl(_pairs(6)), env=_env(first)
            ).returncode
            == 0
        )
        assert (
            _annotate(
                "--pool", pool, "--cache", cache, input=_jsonl(_pairs(6)), env=_env(second)
            ).returncode
            == 0
        )
        assert sum(second.outcomes.values()) > 0


# -- 4: identical outputs are a tie, asked of nobody --------------------------------------------


def test_identical_outputs_are_a_tie_without_a_request(tmp_path):
    pairs = [{"instruction": "Q?", "output_1": "Same.", "output_2": "Same."}] * 3 + _pairs(2)
    with OpenAIServer(respond=judge_longer) as server:
        result = _annotate(
            "--pool",
            _pool_file(tmp_path, "sim_ann"),
            "--no-cache",
            input=_jsonl(pairs),
            env=_env(server),
        )
        asked = sum(
            len(body["messages"]) > 0 and "Same." in orjson.dumps(body).decode()
            for body in server.bodies
        )
    assert result.returncode == 0, result.stderr
    records = _records(result.stdout)
    assert [r["preference"] for r in records[:3]] == [1.5] * 3
    assert all(
        r["provenance"]["farm-annotate"]["tie_reason"] == "identical outputs" for r in records[:3]
    )
    assert asked == 0


# -- 5: evaluation defaults to the noise-free pool ------------------------------------------------


def test_reference_without_pool_uses_sim_eval_and_a_noisy_pool_warns(tmp_path):
    reference = tmp_path / "reference.jsonl"
    reference.write_bytes(
        _jsonl(
            [
                {"instruction": f"Question {i}?", "output": f"Ref {i}.", "generator": "ref"}
                for i in range(4)
            ]
        )
    )
    outputs = _jsonl(
        [
            {"instruction": f"Question {i}?", "output": f"Mine {i}, longer.", "generator": "me"}
            for i in range(4)
        ]
    )
    with OpenAIServer(respond=judge_longer) as server:
        result = _annotate(
            "--reference", str(reference), "--no-cache", input=outputs, env=_env(server)
        )
    assert result.returncode == 0, result.stderr
    assert {r["annotator"] for r in _records(result.stdout)} == {"sim_eval"}
    noisy = run_tool(
        "farm-annotate",
        "--pool",
        "sim_ann_offline",
        "--reference",
        str(reference),
        "--no-cache",
        input=outputs,
    )
    assert noisy.returncode == 0 and b"label noise" in noisy.stderr
    quiet = run_tool(
        "farm-annotate",
        "--pool",
        "sim_eval_offline",
        "--reference",
        str(reference),
        "--no-cache",
        input=outputs,
    )
    assert quiet.returncode == 0 and b"label noise" not in quiet.stderr


def test_shipped_pools_still_load():
    assert load_pool("sim_eval").flip_rate == 0.0


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# -- 3: budgets -----------------------------------------------------------------------------------


def test_max_cost_refuses_a_model_without_a_price(tmp_path):
    with OpenAIServer(respond=judge_longer) as server:
        result = run_tool(
            "farm-annotate",
            "--pool",
            _pool_file(tmp_path, "single"),
            "--model",
            "gpt-4.1-2025-04-14",
            "--max-cost",
            "1e-7",
            "--no-cache",
            input=_jsonl(_pairs(3)),
            env=_env(server),
        )
        assert sum(server.outcomes.values()) == 0
    assert (
        result.returncode == 1
        and b"no price is known for gpt-4.1-2025-04-14" in result.stderr
        and b"--prices" in result.stderr
    )
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpt-4.1-2025-04-14: {prompt: 2.0, completion: 8.0}\n")
    with OpenAIServer(respond=judge_longer) as server:
        priced = _annotate(
            "--pool",
            _pool_file(tmp_path, "single"),
            "--model",
            "gpt-4.1-2025-04-14",
            "--max-cost",
            "1",
            "--prices",
            str(prices),
            "--no-cache",
            input=_jsonl(_pairs(3)),
            env=_env(server),
        )
    assert priced.returncode == 0 and all(
        r["provenance"]["farm-annotate"]["price"] > 0 for r in _records(priced.stdout)
    )


def test_a_record_is_priced_for_every_attempt_it_took(tmp_path):
    pool, pair = _pool_file(tmp_path, "single"), _jsonl(_pairs(1))
    with OpenAIServer(respond=judge_longer) as server:
        once = _records(
            _annotate("--pool", pool, "--no-cache", input=pair, env=_env(server)).stdout
        )[0]
    with OpenAIServer(respond=judge_longer, script=["garbage", None]) as server:
        result = _annotate("--pool", pool, "--no-cache", input=pair, env=_env(server))
        assert server.outcomes["garbage"] == 1 and server.outcomes["ok"] == 1
    twice = _records(result.stdout)[0]
    stamp, first = twice["provenance"]["farm-annotate"], once["provenance"]["farm-annotate"]
    assert stamp["attempts"] == 2 and stamp["prompt_tokens"] == 2 * first["prompt_tokens"]
    assert stamp["price"] > first["price"] > 0
    assert (
        b"could not be parsed (asked again up to parse_retries times): plain-large-t0 1 of 2 (50.0%)"
        in result.stderr
    )


# (script, text, tokens the embedded model's tokenizer makes of it: SmolLM2, a byte-level BPE)
TOKENIZED = [
    (
        "latin",
        "The committee reviewed the proposal in detail and decided to postpone the vote until the budget figures were confirmed by the finance office.",
        25,
    ),
    (
        "latin",
        "To make a simple tomato sauce, warm olive oil in a pan, add chopped garlic, then pour in crushed tomatoes and let it simmer for twenty minutes.",
        31,
    ),
    (
        "latin",
        "Photosynthesis converts light energy into chemical energy, storing it in sugars that plants use to grow.",
        19,
    ),
    ("cjk", "委员会详细审查了这项提案，并决定推迟投票，直到财务部门确认预算数字。", 63),
    (
        "cjk",
        "做简单的番茄酱时，先在锅里加热橄榄油，加入切碎的大蒜，然后倒入番茄碎，小火炖二十分钟。",
        88,
    ),
    ("cjk", "光合作用把光能转化为化学能，并以糖的形式储存起来，供植物生长使用。", 54),
    (
        "cjk",
        "委員会は提案を詳しく検討し、財務部が予算の数字を確認するまで投票を延期することにした。",
        80,
    ),
    (
        "cyrillic",
        "Комитет подробно рассмотрел предложение и решил отложить голосование, пока финансовый отдел не подтвердит цифры бюджета.",
        88,
    ),
    (
        "cyrillic",
        "Чтобы приготовить простой томатный соус, разогрейте оливковое масло, добавьте чеснок и тушите помидоры двадцать минут.",
        89,
    ),
    ("emoji", "Great job team 🎉🎉 we shipped it 🚀 thanks everyone 🙏❤️", 24),
    ("emoji", "😀😃😄😁😆😅😂🤣🥲☺️😊😇🙂🙃😉😌😍🥰😘", 57),
    ("emoji", "Weather today: ☀️ then 🌧️ later, bring an ☂️ 👍", 23),
    (
        "code",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        37,
    ),
    (
        "code",
        "for (int i = 0; i < 100; i++) { total += values[i] * 2; if (total > 1e6) break; }",
        41,
    ),
    (
        "code",
        "SELECT id, name, COUNT(*) FROM users u JOIN orders o ON o.user_id = u.id WHERE o.created_at >= '2024-01-01' GROUP BY 1, 2;",
        54,
    ),
    ("code", "x = [0x7f, 0x3a, 0xff, 12345, 67890]; print(sum(x) / len(x))", 43),
]


@pytest.mark.parametrize(("script", "text", "tokens"), TOKENIZED, ids=lambda v: str(v)[:12])
def test_the_token_estimate_is_within_a_quarter_of_a_real_tokenizer_in_every_script(
    script, text, tokens
):
    # bytes / 4 estimated Chinese at half its tokens, and code and emoji at 0.4 to 0.6: caps that
    # would fit were refused; the estimate reads each script at its own rate
    from farmkit.lm.tokens import estimate_tokens

    assert 0.75 <= estimate_tokens(text) / tokens <= 1.25, (script, estimate_tokens(text), tokens)


def test_the_stored_token_counts_are_the_embedded_tokenizers(embedded_path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(embedded_path / "tokenizer.json"))
    for _, text, tokens in TOKENIZED:
        assert len(tokenizer.encode(text, add_special_tokens=False).ids) == tokens, text


def test_the_budget_bounds_a_prompt_by_its_bytes_in_every_script():
    # what --max-cost holds for a prompt never falls under a token per UTF-8 byte plus the template,
    # whatever replies have shown about how densely the endpoint bills
    from farmkit.annotate.cost import TEMPLATE_TOKENS_PER_REQUEST, Budget, PriceTable, prompt_bound

    for _, text, tokens in TOKENIZED:
        messages = [{"role": "user", "content": text}]
        assert prompt_bound(messages) >= len(text.encode()) + TEMPLATE_TOKENS_PER_REQUEST >= tokens
    budget = Budget(100.0, PriceTable({"m": (1.0, 1.0)}))
    messages = [{"role": "user", "content": TOKENIZED[0][1]}]
    held = budget.reserve("m", prompt_bound(messages), 10)
    held.update(3, 1)  # a reply billed far fewer tokens than the bound
    held.release()
    assert budget.reserve("m", prompt_bound(messages), 10).prompt_bound() == prompt_bound(messages)
    held = budget.reserve("m", 100, 10)
    held.update(200, 1)  # billed beyond the bound: a template longer than allowed for
    assert budget.reserve("m", 100, 10).prompt_bound() == 200


# -- 6: duplicate work is asked once --------------------------------------------------------------


def _pairs_asked(server: OpenAIServer) -> Counter:
    return Counter(frozenset(pair) for body in server.bodies for pair in shown_pairs(body)[1])


def test_repeated_pairs_in_one_run_are_asked_once(tmp_path):
    pairs = _pairs(20)
    mirrored = [{**p, "output_1": p["output_2"], "output_2": p["output_1"]} for p in pairs]
    with OpenAIServer(respond=judge_longer) as server:
        result = _annotate(
            "--pool",
            _pool_file(tmp_path, "single"),
            "--no-cache",
            "--both-orders",
            input=_jsonl(pairs + pairs + mirrored),
            env=_env(server),
        )
        asked = _pairs_asked(server)
    assert result.returncode == 0, result.stderr
    # each pair shown in each order once, whatever how often it (or its mirror image) is in the input
    assert len(asked) == 20 and set(asked.values()) == {2}
    records = _records(result.stdout)
    assert [r["preference"] for r in records] == [2] * 40 + [1] * 20


@pytest.mark.heavy
def test_concurrent_identical_runs_pay_once(tmp_path):
    pool, cache, pairs = _pool_file(tmp_path), str(tmp_path / "c.sqlite"), _jsonl(_pairs(40))
    VerdictCache(cache).close()  # an existing cache, as in a second session of work
    # slow replies, so that the three runs overlap however their starts are spread
    with OpenAIServer(respond=judge_longer, latency=0.4) as server:
        runs = [
            subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "farm-annotate"),
                    "--pool",
                    pool,
                    "--cache",
                    cache,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **_env(server)},
            )
            for _ in range(3)
        ]
        outputs = _communicate(runs, pairs)
        asked = _pairs_asked(server)
    assert [run.returncode for run in runs] == [0] * 3, [err.decode() for _, err in outputs]
    assert len(asked) == 40 and set(asked.values()) == {1}
    stripped = [[_reproducible(r) for r in _records(out)] for out, _ in outputs]
    assert stripped[0] == stripped[1] == stripped[2]


# -- 12: one backend interface ------------------------------------------------------------------


def test_the_engine_asks_backend_classes_not_names():
    import re

    from farmkit.annotate.backends import REGISTRY, backend_class

    root = Path(__file__).resolve().parents[2] / "farmkit" / "annotate"
    for module in ("engine.py", "run.py", "backends.py", "pools.py"):
        text = (root / module).read_text()
        assert not re.search(r"backend\s*(==|!=|in)\s*[(\"']", text), module
        assert not re.search(r"[\"'](openai|local|oracle|file)[\"']\s*(not )?in\b", text), module
    for name in REGISTRY:
        cls = backend_class(name)
        assert cls.name == name and {"cacheable", "priced", "bulk", "needs_endpoint"} <= set(
            dir(cls)
        )


def test_backends_never_import_the_registry():
    import ast

    root = Path(__file__).resolve().parents[2] / "farmkit" / "annotate"
    for module in ("local.py", "oracle.py", "labels.py", "openai_backend.py"):
        imported = {
            node.module
            for node in ast.walk(ast.parse((root / module).read_text()))
            if isinstance(node, ast.ImportFrom)
        }
        assert "farmkit.annotate.backends" not in imported, module


def test_the_run_owns_the_backends_and_closes_them_once_at_its_end(tmp_path):
    # one owner: the backends (and their kept-alive connections) live as long as the Run, across
    # several annotations (online DPO's rounds), and the Run closes them with the cache
    from farmkit.annotate.run import Run

    settings = "settings: {concurrency: 1, backoff: 0.01}\n"
    path = tmp_path / "one.yaml"
    text = importlib.resources.files("farmkit.annotate").joinpath("pools", "single.yaml")
    path.write_text(text.read_text().replace("judges:", settings + "judges:", 1))
    items = _items(4)
    with OpenAIServer(respond=judge_longer) as server:
        os.environ.update(_env(server))
        try:
            run = Run(load_pool(str(path)), cache_path=None)
            first = list(run.records(items[:2]))
            second = list(run.records(items[2:]))
            client = run.annotator.backends.get("openai").client
            assert client._transport.idle  # still open between the two annotations
            run.close()
        finally:
            for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
                os.environ.pop(name, None)
        assert server.connections == 1  # one kept-alive connection served both annotations
    assert [r["preference"] for r in first + second] == [2, 2, 2, 2]
    assert client._transport.idle == [] and run.cache is None


def test_a_cached_run_imports_neither_openai_nor_torch(tmp_path):
    pool, cache = _pool_file(tmp_path), str(tmp_path / "c.sqlite")
    with OpenAIServer(respond=judge_longer) as server:
        first = run_tool(
            "farm-annotate",
            "--pool",
            pool,
            "--cache",
            cache,
            input=_jsonl(_pairs(4)),
            env=_env(server),
        )
        assert first.returncode == 0
        probe = (
            f"import sys; sys.argv = ['farm-annotate', '--pool', {pool!r}, '--cache', {cache!r}]; "
            "from farmkit.tools.farm_annotate import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('LOADED ' + ' '.join(m for m in ('openai', 'torch') if m in sys.modules))"
        )
        result = subprocess.run(
            [sys.executable, "-c", probe],
            input=_jsonl(_pairs(4)),
            capture_output=True,
            env={**os.environ, **_env(server)},
        )
    assert b"4 cache hits" in result.stderr and result.stderr.rstrip().endswith(b"LOADED"), (
        result.stderr
    )


# -- 8: the file backend's mean is a soft label -----------------------------------------------


def test_file_judge_mean_gives_a_soft_label(tmp_path):
    labels = tmp_path / "labels.jsonl"
    pair = {"instruction": "q", "output_1": "a", "output_2": "b"}
    labels.write_bytes(
        _jsonl(
            [
                {**pair, "preference": 2},
                {**pair, "preference": 2},
                {**pair, "preference": 1},
                {"instruction": "r", "output_1": "d", "output_2": "c", "preference": 1},
            ]
        )
    )
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        f"name: crowd\njudges:\n  - {{name: crowd, backend: file, path: {labels}, aggregate: mean}}\n"
    )
    mirrored = {"instruction": "r", "output_1": "c", "output_2": "d"}
    result = run_tool(
        "farm-annotate", "--pool", str(pool), "--no-cache", input=_jsonl([pair, mirrored])
    )
    assert result.returncode == 0, result.stderr
    assert [r["preference"] for r in _records(result.stdout)] == [pytest.approx(5 / 3), 2]


# -- 9: progress bar ------------------------------------------------------------------------------


def test_progress_bar_on_request_and_silent_with_q():
    pairs = _jsonl(_pairs(5))
    shown = run_tool("farm-annotate", "--pool", "gold", "--no-cache", "--progress", input=pairs)
    plain = run_tool("farm-annotate", "--pool", "gold", "--no-cache", input=pairs)
    quiet = run_tool(
        "farm-annotate", "--pool", "gold", "--no-cache", "--progress", "-q", input=pairs
    )
    assert b"5/5" in shown.stderr and b"0 cache hits, 0 requests, 0 failed, $0.0000" in shown.stderr
    assert b"5/5" not in plain.stderr and quiet.stderr == b""
    assert shown.stdout == plain.stdout == quiet.stdout


# -- 11: judge and order assigned by instruction ---------------------------------------------------


def test_assign_by_instruction_gives_every_model_the_same_judge_and_order():
    pool = load_pool("sim_eval_offline")
    items = [
        Item(
            {
                "instruction": f"Q{i}",
                "input": "",
                "output_1": f"ref {i}",
                "output_2": f"model {m} says {i}",
            }
        )
        for i in range(40)
        for m in range(3)
    ]

    def assignments(mode: str) -> list[set]:
        with Annotator(pool, seed=3, assign_by=mode) as annotator:
            records = list(annotator.run(items))
        stamps = [
            (
                r["provenance"]["farm-annotate"]["judge"],
                r["provenance"]["farm-annotate"]["order_shown"],
            )
            for r in records
        ]
        return [set(stamps[3 * i : 3 * i + 3]) for i in range(40)]

    assert all(len(shared) == 1 for shared in assignments("instruction"))
    assert any(len(shared) > 1 for shared in assignments("item"))


def test_a_claim_whose_pid_now_belongs_to_another_process_is_stale(tmp_path):
    import socket

    cache = VerdictCache(tmp_path / "c.sqlite")
    host, pid = socket.gethostname(), os.getpid()
    # a live pid on this host, recorded with a start time that is not this process's: the run that
    # claimed it is gone and the system has given its pid to another process since
    with cache._transaction():
        cache._db.execute(
            "INSERT INTO claims VALUES (?, ?, ?, ?, ?)",
            ("k", f"{host}:{pid}:1:feedface", host, pid, time.time() + 3600),
        )
    mine, theirs, answered = cache.claim(["k"], lease=60)
    cache.close()
    assert (mine, theirs, answered) == (["k"], [], {})


def test_a_key_answered_since_the_cache_was_read_is_not_claimed_again(tmp_path):
    # the race that made three concurrent runs pay twice for a pair: run B reads the cache (a miss), run A
    # writes that key's verdict and drops its claim, then B claims the key and asks again. The claim must
    # see the verdict that landed in between, inside the same transaction.
    path = tmp_path / "c.sqlite"
    a, b = VerdictCache(path), VerdictCache(path)
    assert b.get_many(["k", "j"]) == {}  # B's read of the cache: both miss
    assert a.claim(["k"], lease=60)[0] == ["k"]
    a.put_many({"k": ROW})  # A's verdict lands, its claim ends
    mine, theirs, answered = b.claim(["k", "j"], lease=60)
    a.close(), b.close()
    assert (mine, theirs, answered) == (["j"], [], {"k": ROW})


def test_a_new_cache_file_gets_the_umasks_permissions_like_any_output(tmp_path):
    # a cron job's cache must be readable by whoever reads its outputs: 0644 under umask 022, not 0600
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_bytes(b'{"instruction": "Q?", "output_1": "a", "output_2": "a longer answer"}\n')
    cache, output = tmp_path / "new" / "c.sqlite", tmp_path / "prefs.jsonl"
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "farm-annotate"),
            "--pool",
            "single_offline",
            "--cache",
            str(cache),
            "-o",
            str(output),
            str(pairs),
        ],
        capture_output=True,
        umask=0o022,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert (output.stat().st_mode & 0o777, cache.stat().st_mode & 0o777) == (0o644, 0o644)


def test_a_renewed_claim_outlives_its_first_lease(tmp_path):
    path = tmp_path / "c.sqlite"
    a, b = VerdictCache(path), VerdictCache(path)
    assert a.claim(["kept", "left"], lease=0.2)[0] == ["kept", "left"]
    time.sleep(0.3)
    assert b.claim(["left"], lease=60)[0] == ["left"]  # not renewed: expired, taken over
    a.claim(["kept"], lease=0.2)  # still A's own: claimed again
    a.renew(60)
    time.sleep(0.3)
    mine, theirs, _ = b.claim(["kept"], lease=60)
    a.close(), b.close()
    assert (mine, theirs) == ([], ["kept"])


@pytest.mark.heavy
def test_a_running_annotator_renews_its_claims_beyond_their_lease(tmp_path, monkeypatch):
    # the lease is short (only a run dead on another host waits it out), so a live run whose request
    # takes longer than the lease must renew it, or another run would take the question over and pay again
    import threading

    from farmkit.annotate import engine
    from farmkit.annotate.run import Run

    monkeypatch.setattr(engine, "CLAIM_LEASE", 0.4)
    monkeypatch.setattr(engine, "CLAIM_RENEWAL", 0.1)
    pool = pool_from_dict(
        {
            "name": "slow",
            "settings": {"timeout": 10, "concurrency": 2},
            "judges": [{"name": "j", "backend": "openai", "model": "m", "prompt": "plain"}],
        },
        "test",
    )
    items = [
        Item(p)
        for p in [{"instruction": f"Q{i}?", "output_1": "a", "output_2": "bb"} for i in range(2)]
    ]
    path = tmp_path / "c.sqlite"
    with OpenAIServer(respond=judge_longer, latency=1.5) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        with Run(pool, cache_path=path) as run:
            records: list = []
            worker = threading.Thread(target=lambda: records.extend(run.records(items)))
            worker.start()
            time.sleep(1.0)  # over twice the lease, the first request still unanswered
            other = VerdictCache(path)
            keys = [row[0] for row in other._db.execute("SELECT key FROM claims")]
            mine, theirs, _ = other.claim(keys, lease=60)
            other.close()
            worker.join()
    assert len(keys) >= 1 and (mine, sorted(theirs)) == ([], sorted(keys))
    assert [r["preference"] for r in records] == [2, 2]
    assert server.outcomes["ok"] == len(items)
