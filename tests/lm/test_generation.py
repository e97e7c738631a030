"""Prompts longer than the model's context: generation keeps their end, warns, and never tokenizes a
huge prompt whole (measured on main: a 50 MB one-line prompt grew farm-sample to 24 GB)."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from farmkit.core.io import FarmError
from farmkit.lm.generation import DecodingConfig, generate, prompt_room


def test_a_prompt_longer_than_the_context_is_left_truncated_with_a_warning(tiny_model_path, caplog):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    seen: list[int] = []
    encode = tokenizer.__class__.__call__

    def spy(self, text, **kwargs):
        seen.extend(len(t) for t in ([text] if isinstance(text, str) else text))
        assert max(seen) < 100_000, (
            "the whole 10 MB prompt was tokenized"
        )  # fail fast, not after an OOM
        return encode(self, text, **kwargs)

    config = DecodingConfig(temperature=0, max_new_tokens=4, batch_size=2)
    room = 1024 - 4  # the tiny model's max_position_embeddings
    huge = "word " * 2_000_000 + "Now answer: what is two plus two?"  # 10 MB on one line
    tokenizer.__class__.__call__ = spy
    try:
        with caplog.at_level(logging.WARNING, logger="farmkit"):
            samples = generate(model, tokenizer, ["A short prompt.", huge], config)
    finally:
        tokenizer.__class__.__call__ = encode
    assert samples[1][0].prompt_tokens == room
    assert samples[0][0].prompt_tokens == len(
        tokenizer("A short prompt.", add_special_tokens=False)["input_ids"]
    )
    assert [r.message for r in caplog.records if "context" in r.message] == [
        f"prompt 2 of 2 is longer than the model's context allows ({room} tokens beside max_new_tokens; "
        f"it has {len(huge):,} characters): keeping its last {room} tokens"
    ]


def test_no_room_for_a_prompt_is_an_error(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    assert prompt_room(model, tokenizer, 24) == 1000
    with pytest.raises(
        FarmError, match="max_new_tokens is 1024, but the model's context holds 1024 tokens"
    ):
        prompt_room(model, tokenizer, 1024)


def _no_huge_tokenization(tokenizer, limit: int = 100_000):
    """Make tokenizing a text longer than `limit` characters fail at once (instead of after an OOM);
    returns the function that undoes it."""
    encode = tokenizer.__class__.__call__

    def spy(self, text, **kwargs):
        lengths = [len(t) for t in ([text] if isinstance(text, str) else text)]
        assert max(lengths, default=0) < limit, "a huge prompt was tokenized whole"
        return encode(self, text, **kwargs)

    tokenizer.__class__.__call__ = spy
    return lambda: setattr(tokenizer.__class__, "__call__", encode)


def test_vllm_prompts_fit_max_model_len_keeping_their_end(tiny_model_path, caplog):
    # vLLM is not installed here: the function that turns prompts into token ids for it is tested alone
    from farmkit.lm.sampling import vllm_prompts

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    huge = "word " * 2_000_000 + "Now answer: what is two plus two?"
    undo = _no_huge_tokenization(tokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="farmkit"):
            prompts = vllm_prompts(tokenizer, ["A short prompt.", huge], 256, 16)
    finally:
        undo()
    short, long = (prompt["prompt_token_ids"] for prompt in prompts)
    assert short == tokenizer("A short prompt.", add_special_tokens=False)["input_ids"]
    end = tokenizer(huge[-2000:], add_special_tokens=False)["input_ids"]
    assert len(long) == 256 - 16 and long[-20:] == end[-20:]
    assert any(
        "prompt 2 of 2 is longer than the model's context" in r.message for r in caplog.records
    )
    with pytest.raises(FarmError, match="max_new_tokens is 256, but the model's context holds 256"):
        vllm_prompts(tokenizer, ["A short prompt."], 256, 256)


def test_farm_sample_openai_refuses_a_prompt_longer_than_any_context_before_sending(tmp_path):
    import orjson
    from click.testing import CliRunner
    from farmkit.tools.farm_sample import cli
    from openai_server import OpenAIServer

    prompts = tmp_path / "prompts.jsonl"
    huge = "word " * 2_000_000  # 10 MB on one line
    prompts.write_bytes(
        b"".join(
            orjson.dumps({"instruction": text}) + b"\n" for text in ("Say hi.", huge, "Say bye.")
        )
    )
    with OpenAIServer() as server:
        result = CliRunner().invoke(
            cli,
            ["m", str(prompts), "--backend", "openai", "-n", "1", "-q"],
            env={"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "k"},
        )
    assert result.exit_code == 1 and result.stdout_bytes == b""
    message = str(result.exception)
    assert "prompt 2 of 3 has 10,000,000 characters" in message, message
    assert server.outcomes == {}  # nothing sent, nothing paid


def test_rollout_prompts_are_cut_to_the_context_once_and_sampled_from_their_end(
    tiny_model_path, caplog
):
    from farmkit.train.policy import fit_rollout_prompts, sample_rollout

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    huge = "word " * 2_000_000 + "Now answer: what is two plus two?"  # 10 MB on one line
    undo = _no_huge_tokenization(tokenizer)
    try:
        with caplog.at_level(logging.WARNING, logger="farmkit"):
            fitted = fit_rollout_prompts(model, tokenizer, ["A short prompt.", huge], 4, reserve=1)
    finally:
        undo()
    room = 1024 - 4 - 1  # the context, less the answer and one control token
    end = tokenizer(huge[-2000:], add_special_tokens=False)["input_ids"]
    assert len(fitted[1]) == room and fitted[1][-20:] == end[-20:]
    assert fitted[0] == tokenizer("A short prompt.", add_special_tokens=False)["input_ids"]
    assert sum("prompt 2 of 2 is longer" in r.message for r in caplog.records) == 1
    torch.manual_seed(0)
    rollout = sample_rollout(model, tokenizer, fitted, 1.0, 4)
    assert rollout.prompt_ids.shape[1] == room
    assert rollout.prompt_mask.sum(1).tolist() == [len(fitted[0]), room]
    assert rollout.prompt_ids[1].tolist() == fitted[1]  # left padding: the long row is all prompt


def _trainer(method: str, sft, rm, prompts, output):
    """One short run of an RL method (one step or round, small batches) on the tiny models."""
    common = dict(learning_rate=1e-3, temperature=1.0, max_new_tokens=4)
    if method == "ppo":
        from farmkit.methods.ppo import PPOConfig, train_ppo

        config = PPOConfig(
            steps=1, rollout_batch_size=4, minibatch_size=4, micro_batch_size=4, **common
        )
        return train_ppo(str(sft), str(rm), prompts, str(output), config, seed=0)
    if method == "quark":
        from farmkit.methods.quark import QuarkConfig, train_quark

        config = QuarkConfig(
            rounds=2,
            prompts_per_round=4,
            samples_per_prompt=2,
            num_quantiles=2,
            batch_size=4,
            **common,
        )
        return train_quark(str(sft), str(rm), prompts, str(output), config, seed=0)
    from farmkit.methods.group import GRPOConfig, RLOOConfig, train_group

    config_class = RLOOConfig if method == "rloo" else GRPOConfig
    config = config_class(
        steps=1,
        rollout_batch_size=8,
        samples_per_prompt=2,
        minibatch_size=8,
        micro_batch_size=8,
        **common,
    )
    return train_group(str(sft), str(rm), prompts, str(output), config, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ppo", "quark", "rloo", "grpo"])
def test_rl_rollouts_cut_prompts_longer_than_the_context(
    tiny_model_path, tmp_path_factory, tmp_path, method, monkeypatch, caplog
):
    import json
    import shutil

    from policy_fixtures import keyword_reward_model, prompt_records, tiny_sft

    from farmkit.train import policy

    # the tiny SFT policy with a context of 64 tokens, so that a prompt of a few hundred characters
    # is too long and the rollouts stay cheap
    sft = tmp_path / "sft-64"
    shutil.copytree(tiny_sft(tiny_model_path, tmp_path_factory.mktemp("sft")), sft)
    config = json.loads((sft / "config.json").read_text())
    (sft / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    rm = keyword_reward_model(tiny_model_path, tmp_path_factory.mktemp("rm"))
    # three of the four prompts are this long one (~100 tokens), so every method's rollouts meet it
    long = {"instruction": "word " * 100 + "Name a colour.", "input": ""}
    prompts = [long] * 3 + prompt_records(1)
    widths: list[int] = []
    sample = policy.sample_rollout

    def spy(*args, **kwargs):
        rollout = sample(*args, **kwargs)
        widths.append(int(rollout.prompt_mask.sum(1).max()))
        return rollout

    monkeypatch.setattr(policy, "sample_rollout", spy)
    with caplog.at_level(logging.WARNING, logger="farmkit"):
        _trainer(method, sft, rm, prompts, tmp_path / method)
    assert (tmp_path / method / "meta.json").exists()
    # the prompt kept its end (the model's context holds 64 tokens, 4 of them for the answer)
    assert widths and max(widths) == 64 - 4
    warnings = [r.message for r in caplog.records if "longer than the model's context" in r.message]
    assert len(warnings) == 3  # once per prompt, not once per rollout


def test_reward_model_inputs_keep_their_end_without_tokenizing_a_huge_text_whole(tiny_model_path):
    # the reward model's encoder (farm-score, farm-bon, PPO's scorer) keeps the last max_length tokens,
    # where the response and its end token sit, and tokenizes only a window of a 10 MB text
    from farmkit.train.scoring import tail_token_ids

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    short = "A short text and its answer."
    huge = "word " * 2_000_000 + "The answer is four."
    expected = tokenizer(huge[-2000:], add_special_tokens=False)["input_ids"][-64:]
    undo = _no_huge_tokenization(tokenizer)
    try:
        encoded = tail_token_ids(tokenizer, [short, huge], max_length=64)
    finally:
        undo()
    assert encoded[0] == tokenizer(short, add_special_tokens=False)["input_ids"]
    assert len(encoded[1]) == 64 and encoded[1] == expected


def _prompt_files(tmp_path):
    """prompts.jsonl: two ordinary prompts around a 10 MB one (line 2); short.jsonl: the two alone."""
    import orjson

    short = [{"instruction": "Say hi.", "id": 1}, {"instruction": "Say bye.", "id": 3}]
    huge = {"instruction": "word " * 2_000_000 + "Now answer: what is two plus two?", "id": 2}
    both = tmp_path / "prompts.jsonl"
    both.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (short[0], huge, short[1])))
    alone = tmp_path / "short.jsonl"
    alone.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in short))
    return both, alone


def _timed(run_farm, *args):
    import time

    start = time.perf_counter()
    done = run_farm(*args, timeout=600)
    return done, time.perf_counter() - start


def _outputs(done):
    import orjson

    return [orjson.loads(line) for line in done.stdout.splitlines()]


def test_farm_sample_decides_each_over_long_prompt_early_as_long_prompts_says(
    tiny_model_path, tmp_path, run_farm
):
    """A 10 MB prompt among ordinary ones, with the tiny model (a 1,024-token context): fail stops
    naming FILE:2 before the model loads, skip leaves it out (counted) and truncate keeps its end; each
    within a small multiple of the time the ordinary prompts take alone, and the other records'
    outputs are those of a run without it (greedy decoding)."""
    both, alone = _prompt_files(tmp_path)
    common = ("-n", "1", "--temperature", "0", "--max-new-tokens", "4", "--backend", "hf")
    base, base_seconds = _timed(run_farm, "farm-sample", str(tiny_model_path), str(alone), *common)
    assert base.returncode == 0, base.stderr.decode()
    expected = _outputs(base)

    failed, seconds = _timed(run_farm, "farm-sample", str(tiny_model_path), str(both), *common)
    assert failed.returncode == 1 and failed.stdout == b""
    stderr = failed.stderr.decode()
    assert (
        f"farm-sample: error: {both}:2: the prompt has 10,000,033 characters, more than the "
        in (stderr)
    )
    assert "(1,020 tokens); expected a shorter prompt: --long-prompts skip" in stderr
    assert seconds < 3 * base_seconds, (seconds, base_seconds)

    # that run gave no --long-prompts: the default is fail
    from farmkit.tools.farm_sample import cli

    (option,) = [param for param in cli.params if param.name == "long_prompts"]
    assert option.default == "fail"

    skipped, seconds = _timed(
        run_farm, "farm-sample", str(tiny_model_path), str(both), *common, "--long-prompts", "skip"
    )
    assert skipped.returncode == 0, skipped.stderr.decode()
    assert _outputs(skipped) == expected
    stderr = skipped.stderr.decode()
    assert f"{both}:2: the prompt has 10,000,033 characters" in stderr
    assert "skipped 1 over-long prompt(s) of 3 (--long-prompts skip)" in stderr
    assert seconds < 3 * base_seconds, (seconds, base_seconds)

    cut, seconds = _timed(
        run_farm,
        "farm-sample",
        str(tiny_model_path),
        str(both),
        *common,
        "--long-prompts",
        "truncate",
    )
    assert cut.returncode == 0, cut.stderr.decode()
    records = _outputs(cut)
    assert [r["id"] for r in records] == [1, 2, 3]
    assert [records[0], records[2]] == expected
    assert "prompt 2 of 3 is longer than the model's context allows" in cut.stderr.decode()
    assert "keeping its last 1020 tokens" in cut.stderr.decode()
    assert seconds < 3 * base_seconds, (seconds, base_seconds)


@pytest.mark.parametrize("tool", ["farm-bon", "farm-expiter"])
def test_best_of_n_and_expert_iteration_refuse_an_over_long_prompt_before_any_model(
    tiny_model_path, tmp_path, run_farm, tool
):
    """The same decision, made in the same place: the reward model is not even looked at."""
    both, _ = _prompt_files(tmp_path)
    output = ["-o", str(tmp_path / "out")] if tool == "farm-expiter" else []
    done = run_farm(tool, str(tiny_model_path), str(tmp_path / "no-rm"), str(both), *output)
    assert done.returncode == 1 and done.stdout == b""
    assert f"{both}:2: the prompt has 10,000,033 characters" in done.stderr.decode()


def test_the_decision_never_tokenizes_a_huge_prompt_whole(tiny_model_path):
    from farmkit.lm.sampling import screen_long_prompts

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    undo = _no_huge_tokenization(tokenizer)
    spaces = {"instruction": " " * 5_000_000 + "hi"}  # few tokens per character: the char bound
    try:
        kept = screen_long_prompts(
            str(tiny_model_path),
            [
                ("p:1", {"instruction": "Say hi."}),
                ("p:2", spaces),
                ("p:3", {"instruction": "x" * 900}),
            ],
            "auto",
            4,
            "skip",
        )
    finally:
        undo()
    assert kept == [{"instruction": "Say hi."}, {"instruction": "x" * 900}]
