"""farm-sample: records and their order, seeded reproducibility, --resume, the control token of a
reward-conditioned folder, and the openai backend against a real local HTTP server."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools.farm_sample import cli
from openai_server import OpenAIServer

from farmkit.lm import generation, sampling

PROMPTS = [
    {"instruction": "Name a colour.", "input": "", "id": "a", "split": "eval"},
    {
        "instruction": "Translate the sentence into German.",
        "input": "The weather is fine today and the sun is out.",
        "id": "b",
    },
    {"instruction": "Count to three.", "id": "c"},
    {"instruction": "Write one word.", "input": "", "id": "d"},
    {
        "instruction": "Say hello to the reader in a long and friendly sentence.",
        "input": "",
        "id": "e",
    },
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def sample(*args: str, env: dict | None = None, exit_code: int = 0):
    result = CliRunner().invoke(cli, [*args, "-q"], env=env)
    assert result.exit_code == exit_code, (result.output, result.exception)
    return result


def records_of(text: str | bytes) -> list[dict]:
    return [
        json.loads(line)
        for line in (text.decode() if isinstance(text, bytes) else text).splitlines()
    ]


@pytest.fixture
def prompts(tmp_path) -> Path:
    return write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)


def test_n_samples_per_prompt_consecutive_with_all_fields(tiny_model_path, prompts):
    args = [
        str(tiny_model_path),
        str(prompts),
        "-n",
        "2",
        "--temperature",
        "1.0",
        "--max-new-tokens",
        "6",
        "--generation-batch-size",
        "4",
    ]
    first = sample(*args, "--seed", "3").stdout
    records = records_of(first)
    assert [(r["id"], r["sample_index"]) for r in records] == [
        (p["id"], k) for p in PROMPTS for k in (0, 1)
    ]
    for record in records:
        assert record["generator"] == tiny_model_path.name
        assert (
            record["temperature"],
            record["top_p"],
            record["max_new_tokens"],
            record["seed"],
        ) == (1.0, 1.0, 6, 3)
        assert record["provenance"]["farm-sample"]["backend"] == "hf"
        assert isinstance(record["output"], str) and record["output"]
    assert (
        records[0]["split"] == "eval" and records[4]["input"] == ""
    )  # other fields pass through, input filled
    assert records[0]["output"] != records[1]["output"]  # two samples, not one repeated

    assert sample(*args, "--seed", "3").stdout == first  # same seed: same bytes
    other = records_of(sample(*args, "--seed", "4").stdout)
    assert [r["output"] for r in other] != [r["output"] for r in records]


def test_generator_name_defaults(embedded_path, tiny_model_path, tmp_path):
    assert sampling.generator_name("embedded") == "SmolLM2-135M-Instruct"  # meta.json's name
    assert (
        sampling.generator_name(str(tiny_model_path) + "/") == tiny_model_path.name
    )  # the folder's base name
    assert sampling.generator_name("someone/some-model") == "someone/some-model"  # the argument


def test_resume_finishes_without_regenerating_and_matches_an_uninterrupted_run(
    tiny_model_path, prompts, tmp_path, monkeypatch
):
    args = [
        str(tiny_model_path),
        str(prompts),
        "-n",
        "2",
        "--temperature",
        "1.0",
        "--max-new-tokens",
        "5",
        "--generation-batch-size",
        "4",
    ]
    straight = tmp_path / "straight.jsonl"
    sample(*args, "-o", str(straight))

    generated: list[int] = []
    original_generate = generation.generate

    def spy(model, tokenizer, prompts, config, seed=0, on_batch=None, skip=(), compiled=False):
        def counted(indices, samples):
            generated.extend(indices)
            on_batch(indices, samples)
            if interrupt and len(generated) >= 2:
                raise KeyboardInterrupt

        return original_generate(
            model,
            tokenizer,
            prompts,
            config,
            seed=seed,
            on_batch=counted,
            skip=skip,
            compiled=compiled,
        )

    monkeypatch.setattr(generation, "generate", spy)
    out = tmp_path / "resumed.jsonl"
    interrupt = True
    result = CliRunner().invoke(cli, [*args, "-o", str(out), "-q"])
    assert result.exit_code != 0
    side = Path(f"{out}.resume.jsonl")
    assert not out.exists() and side.exists()  # no partial output, the progress kept aside
    done_first = list(generated)
    assert len(done_first) == 2  # batch size 4 with n=2: two prompts per batch

    generated.clear()
    interrupt = False
    sample(*args, "-o", str(out), "--resume")
    assert sorted(generated) == sorted(
        set(range(len(PROMPTS))) - set(done_first)
    )  # finished prompts not redone
    assert out.read_bytes() == straight.read_bytes()
    assert not side.exists()


def test_resume_refuses_a_side_file_of_other_settings(tiny_model_path, prompts, tmp_path):
    out = tmp_path / "out.jsonl"
    Path(f"{out}.resume.jsonl").write_bytes(
        orjson.dumps({"farm_sample_resume": {"settings": "other"}}) + b"\n"
    )
    result = sample(str(tiny_model_path), str(prompts), "-o", str(out), "--resume", exit_code=1)
    assert "other prompts or settings" in str(result.exception)
    assert (
        "--resume needs -o FILE" in sample("embedded", str(prompts), "--resume", exit_code=2).output
    )


def test_control_token_of_a_reward_conditioned_folder_is_applied(
    tiny_model_path, prompts, tmp_path, monkeypatch
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from farmkit.lm.models import write_meta

    folder = tmp_path / "conditioned"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.add_special_tokens({"extra_special_tokens": ["<|preferred|>", "<|not_preferred|>"]})
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_meta(
        folder,
        {"kind": "policy", "prompt_template": "chat", "sampling_control_token": "<|preferred|>"},
    )

    seen: list[str] = []
    original_generate = generation.generate

    def spy(model, tokenizer, prompts, config, seed=0, on_batch=None, skip=(), compiled=False):
        seen.extend(prompts)
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            assert ids[-1] == tokenizer.convert_tokens_to_ids("<|preferred|>")
        return original_generate(
            model, tokenizer, prompts, config, seed=seed, on_batch=on_batch, skip=skip
        )

    monkeypatch.setattr(generation, "generate", spy)
    records = records_of(
        sample(str(folder), str(prompts), "-n", "1", "--max-new-tokens", "3").stdout
    )
    assert len(seen) == len(PROMPTS) and len(records) == len(PROMPTS)
    assert all(p.endswith("<|im_start|>assistant\n<|preferred|>") for p in seen)
    assert "<|preferred|>" not in "".join(r["output"] for r in records)
    assert records[0]["provenance"]["farm-sample"]["control"] == "<|preferred|>"


def test_empty_input_to_a_file_writes_an_empty_file(tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    sample("embedded", str(empty), "-o", str(tmp_path / "out.jsonl"))
    assert (tmp_path / "out.jsonl").read_bytes() == b""


# ---------------------------------------------------------------------------------------------
# The openai backend, against tests/openai_server.py


class InFlight:
    """A reply function that counts requests being answered at the same moment."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, body: dict) -> str:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.05)
        with self.lock:
            self.now -= 1
        return f"answer to [{body['messages'][-1]['content']}] seed {body['seed']}"


def test_openai_backend_samples_in_order_with_bounded_concurrency(prompts):
    replies = InFlight()
    secret = "sk-test-secret-0123456789"
    with OpenAIServer(
        respond=replies, api_key=secret, models={"ref-model"}, script=["429", "500"]
    ) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": secret}
        result = CliRunner().invoke(
            cli,
            [
                "ref-model",
                str(prompts),
                "--backend",
                "openai",
                "-n",
                "2",
                "--concurrency",
                "3",
                "--seed",
                "5",
            ],
            env=env,
        )
        assert result.exit_code == 0, result.output
        records = records_of(result.stdout)
        assert [(r["id"], r["sample_index"]) for r in records] == [
            (p["id"], k) for p in PROMPTS for k in (0, 1)
        ]
        assert all(
            r["generator"] == "ref-model" and r["provenance"]["farm-sample"]["backend"] == "openai"
            for r in records
        )
        # the user turn is the chat template's: instruction, a blank line, then the input
        assert records[2]["output"].startswith(
            f"answer to [{PROMPTS[1]['instruction']}\n\n{PROMPTS[1]['input']}]"
        )
        assert records[0]["output"] != records[1]["output"]  # each sample has its own seed
        assert (
            server.outcomes["429"] == 1
            and server.outcomes["500"] == 1
            and server.outcomes["ok"] == 10
        )
        assert 1 < replies.most <= 3
        assert secret not in result.output

        again = CliRunner().invoke(
            cli,
            ["ref-model", str(prompts), "--backend", "openai", "-n", "2", "--seed", "5"],
            env=env,
        )
        assert again.stdout == result.stdout  # per-request seeds: same order and outputs

        wrong_model = CliRunner().invoke(
            cli, ["no-such-model", str(prompts), "--backend", "openai"], env=env
        )
        assert wrong_model.exit_code == 1 and "has no model 'no-such-model'" in str(
            wrong_model.exception
        )
        wrong_key = CliRunner().invoke(
            cli,
            ["ref-model", str(prompts), "--backend", "openai"],
            env={**env, "OPENAI_API_KEY": "sk-wrong-key-abcdef"},
        )
        assert (
            wrong_key.exit_code == 1
            and "sk-wrong-key-abcdef" not in str(wrong_key.exception) + wrong_key.output
        )


def test_a_reply_that_echoes_the_key_is_written_without_it(prompts):
    """An endpoint (or a proxy, or a model told the request's headers) that puts the client's key
    in its answer: farm-sample's records hold the answer with the key and its pieces blanked."""
    secret = "sk-echoed-secret-0123456789abcdef"
    with OpenAIServer(
        respond=lambda body: f"your key is {secret}, or {secret[3:15]}",
        api_key=secret,
        models={"ref-model"},
    ) as server:
        env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": secret}
        result = CliRunner().invoke(
            cli, ["ref-model", str(prompts), "--backend", "openai"], env=env
        )
    assert result.exit_code == 0, result.output
    records = records_of(result.stdout)
    assert records and all(r["output"].startswith("your key is ***") for r in records)
    pieces = {secret[i : i + 8] for i in range(len(secret) - 7)}
    assert not any(piece in result.stdout + result.output for piece in pieces)


def test_openai_backend_needs_a_key_or_an_endpoint(prompts):
    result = CliRunner().invoke(
        cli,
        ["gpt-x", str(prompts), "--backend", "openai", "-q"],
        env={"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""},
    )
    assert result.exit_code == 1 and "needs OPENAI_API_KEY" in str(result.exception)


@pytest.mark.skipif(sampling.vllm_usable(), reason="vLLM and a GPU are present")
def test_vllm_backend_without_a_gpu_is_a_clear_error(tiny_model_path, prompts):
    assert sampling.default_backend() == "hf"
    result = sample(str(tiny_model_path), str(prompts), "--backend", "vllm", exit_code=1)
    assert "needs vLLM installed" in str(result.exception)


def test_compile_generation_reaches_the_hf_engine_and_is_refused_for_the_others(
    tiny_model_path, prompts, monkeypatch
):
    asked: list[bool] = []
    original = generation.generate

    def spy(*args, compiled=False, **kwargs):
        asked.append(compiled)
        return original(*args, **kwargs)

    monkeypatch.setattr(generation, "generate", spy)
    args = [str(tiny_model_path), str(prompts), "-n", "1", "--max-new-tokens", "2"]
    eager = records_of(sample(*args, "--backend", "hf").stdout)
    compiled = records_of(sample(*args, "--backend", "hf", "--compile-generation").stdout)
    assert asked == [False, True]
    assert "compile_generation" not in eager[0]["provenance"]["farm-sample"]
    assert compiled[0]["provenance"]["farm-sample"]["compile_generation"] is True
    result = sample(
        "gpt-x", str(prompts), "--backend", "openai", "--compile-generation", exit_code=2
    )
    assert "--compile-generation is for the hf backend (transformers' generate)" in result.output
