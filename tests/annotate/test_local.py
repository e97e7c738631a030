"""The `local` backend on the embedded model: verdicts from the log-probabilities of " A" and " B",
undone from the order shown, cached like any paid verdict."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner
from farmkit.tools.farm_annotate import cli

PAIRS = [
    {
        "instruction": "What is the capital of France?",
        "output_1": "The capital of France is Paris.",
        "output_2": "Bananas are yellow.",
    },
    {"instruction": "Add 2 and 3.", "output_1": "2 + 3 = 5.", "output_2": "I like trains."},
    {
        "instruction": "Name a primary color.",
        "output_1": "Tuesday.",
        "output_2": "Red is a primary color.",
    },
    {
        "instruction": "Translate 'gato' from Spanish to English.",
        "output_1": "It means 'cat'.",
        "output_2": "Seven.",
    },
]


def _run(*args: str) -> tuple[list[dict], bytes]:
    payload = b"".join(orjson.dumps(p) + b"\n" for p in PAIRS)
    result = CliRunner().invoke(
        cli, ["--pool", "local_embedded", *args], input=payload, catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    return [orjson.loads(line) for line in result.stdout_bytes.splitlines()], result.stderr_bytes


def test_local_judge_reads_answer_log_probabilities_and_caches_them(embedded_path, tmp_path):
    cache = str(tmp_path / "local.sqlite")
    records, stderr = _run("--cache", cache)
    assert len(records) == len(PAIRS) and b"0 cache hits" in stderr
    probabilities = []
    for record in records:
        details = record["provenance"]["farm-annotate"]
        assert (
            details["backend"] == "local"
            and details["model"] == "embedded"
            and details["prompt_tokens"] > 20
        )
        p_first = details["p_first_better"]
        probabilities.append(p_first)
        assert 0 < p_first < 1
        # the verdict is the likelier side, mapped back from the order shown to output_1/output_2
        first_is_output_1 = details["order_shown"] == "1,2"
        assert record["preference"] == (1 if (p_first > 0.5) == first_is_output_1 else 2)
    assert len({round(p, 4) for p in probabilities}) == len(
        PAIRS
    )  # it reads the content, not a constant
    again, stderr = _run("--cache", cache)
    assert b"4 cache hits" in stderr
    assert [r["preference"] for r in again] == [r["preference"] for r in records]


def test_oracle_judge_with_a_reward_model_folder(tiny_model_path, tmp_path):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    folder = tmp_path / "rm"
    config = LlamaConfig.from_pretrained(tiny_model_path, num_labels=1)
    torch.manual_seed(1)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(folder)
    pool = tmp_path / "rm-pool.yaml"
    pool.write_text(
        orjson.dumps(
            {
                "name": "rm-gold",
                "judges": [{"name": "rm", "backend": "oracle", "reward": str(folder)}],
            }
        ).decode()
    )
    answers = [
        "Paris.",
        "It is Lyon, I think.",
        "The capital of France is Paris, on the Seine.",
        "No idea.",
    ]
    pairs = [
        {"instruction": "What is the capital of France?", "output_1": a, "output_2": b}
        for a in answers
        for b in answers
    ]
    payload = b"".join(orjson.dumps(p) + b"\n" for p in pairs)
    result = CliRunner().invoke(
        cli, ["--pool", str(pool), "--no-cache"], input=payload, catch_exceptions=False
    )
    assert result.exit_code == 0, result.stderr
    verdict = {
        (r["output_1"], r["output_2"]): r["preference"]
        for r in map(orjson.loads, result.stdout_bytes.splitlines())
    }
    for a in answers:
        assert verdict[(a, a)] == 1.5  # the same reward on both sides
        for b in answers:
            if a != b:
                assert {verdict[(a, b)], verdict[(b, a)]} == {
                    1,
                    2,
                }  # the order shown does not matter
    # the reward model orders the answers: exactly one of them beats all the others
    winners = [a for a in answers if all(verdict[(a, b)] == 1 for b in answers if b != a)]
    assert len(winners) == 1


def test_oracle_reward_model_scores_as_the_methods_do(tiny_model_path, tmp_path):
    """The gold reward of a reward-model oracle is RewardScorer's score, the one the methods optimize:
    the end-of-sequence token is read (its pad id is the eos id, which the model's own pooling would
    skip) and the prompt is formatted as the reward model was trained."""
    from policy_fixtures import keyword_reward_model

    from farmkit.annotate.oracle import OracleBackend
    from farmkit.annotate.pools import Judge, Pool
    from farmkit.train.scoring import RewardScorer

    folder = keyword_reward_model(tiny_model_path, tmp_path / "rm")
    judge = Judge(name="rm", backend="oracle", reward=str(folder))
    backend = OracleBackend(Pool(name="rm-gold", description="", judges=[judge]), {})
    triples = [
        ("Name a colour.", "", "blue"),
        ("Name a colour.", "", "blue sky"),
        ("Name a colour.", "", "green"),
    ]
    expected = RewardScorer(folder, device="cpu").score(triples)
    # the keyword reward model pays for "blue" right before the scored token, the end token
    assert expected == pytest.approx([1.0, 0.0, 0.0], abs=1e-3)
    assert backend.rewards(str(folder), triples) == pytest.approx(expected, abs=1e-5)
