"""Best-of-n: sample n outputs per prompt from a policy, score them with a reward model, keep the best.

One sampling pass serves a whole sweep of n: the best of the first k samples, for every k asked for,
so an over-optimization curve (reward against n) costs the largest n's samples and nothing more.
Expert iteration uses the same selection to build its demonstrations.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from farmkit.core.io import FarmError, read_records
from farmkit.core.values import AT_LEAST_ONE
from farmkit.lm.generation import DecodingConfig, Sample
from farmkit.train.config import ModelArgs, help_field

log = logging.getLogger("farmkit")


@dataclass
class BestOfNOutputs:
    """What farm-bon writes besides the best outputs, and how it names them (its options)."""

    generator: str | None = help_field(
        None,
        "Name of the policy in generator fields (default: its folder name); '-best-of-N' is appended.",
        show_default=False,
    )
    all_samples: str | None = help_field(
        None,
        "Also write every scored sample to this file (output records with reward).",
        path={"dir_okay": False, "allow_dash": False},
        show_default=False,
    )
    metrics_path: str | None = help_field(
        None,
        "Also write one metrics row per n to this file (the trainers' metrics.jsonl schema: "
        "step = n, reward, kl = log n - (n-1)/n, response_length, the budget of best-of-n alone, and "
        "the gold figures with --gold), which farm-plot curves draws.",
        flags=("--metrics",),
        path={"dir_okay": False, "allow_dash": False},
        show_default=False,
    )


@dataclass
class BestOfNConfig(ModelArgs):
    """Sampling settings of best-of-n; `ns` lists every n to select for (the largest is sampled)."""

    ns: tuple[int, ...] = (16,)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 300
    batch_size: int = 16  # sequences per generation pass
    score_batch_size: int = field(default=16, metadata={"bounds": AT_LEAST_ONE})
    # what samples: hf, vllm or auto (farmkit.train.rollout_backends.resolve_backend); farm-expiter's --rollout-backend
    backend: str = "hf"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.ns = tuple(sorted(set(self.ns)))
        if not self.ns or self.ns[0] < 1:
            raise ValueError("every n must be at least 1")
        if self.temperature <= 0:
            raise ValueError("best-of-n needs sampling: temperature must be > 0")
        DecodingConfig(**self.decoding_fields())  # the decoding settings' own checks

    def decoding_fields(self) -> dict[str, Any]:
        return {
            "n": max(self.ns),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "batch_size": self.batch_size,
        }

    def gold_sampling(self) -> dict[str, Any]:
        """How a gold judge of this run samples its answers (farmkit.train.gold.GoldRequest)."""
        return {
            "template": self.template,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
            "batch_size": self.batch_size,
        }


@dataclass
class ScoredPrompt:
    """A prompt record with its samples, in sampling order, and their rewards."""

    record: dict[str, Any]
    samples: list[Sample]
    rewards: list[float] = field(default_factory=list)

    def best(self, k: int) -> int:
        """Index of the highest reward among the first k samples (the earliest one on a tie)."""
        window = self.rewards[:k]
        return window.index(max(window))


def rerank(scored_path: str, ns: list[int], generator: str) -> Iterator[dict[str, Any]]:
    """For each n, the best of the first n samples of every prompt (by their `reward`, in sampling
    order), as output records named GENERATOR-best-of-N: one sampling pass gives the whole sweep."""
    prompts: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for record in read_records(scored_path, "reward"):
        prompts[(record["instruction"], record.get("input") or "")].append(record)
    groups = []
    for records in prompts.values():
        records.sort(key=lambda r: r.get("sample_index", 0))
        group = ScoredPrompt(
            records[0],
            [Sample(r["output"], 0, 0, True) for r in records],
            [r["reward"] for r in records],
        )
        groups.append((group, records))
    if any(len(records) < max(ns) for _, records in groups):
        raise FarmError(
            f"{scored_path}: fewer than {max(ns)} samples for some prompt; expected a sampling pass of n >= {max(ns)}"
        )
    for n in ns:
        for group, records in groups:
            chosen = dict(records[group.best(n)])
            chosen.update(generator=f"{generator}-best-of-{n}", best_of=n)
            yield chosen


def sample_and_score(
    policy: str | os.PathLike,
    scorer: Any,
    prompts: Sequence[dict[str, Any]],
    config: BestOfNConfig,
    device: str = "auto",
) -> list[ScoredPrompt]:
    """Sample max(config.ns) outputs per prompt record from `policy` and score every one with `scorer`
    (a farmkit.train.scoring.RewardScorer). The policy is released before scoring.

    Under a launcher with several processes each samples and scores its share of the batches (with
    the seeds one process would use) and every process gets back all of them, in input order: the
    same result as one process."""
    from farmkit.core import distributed
    from farmkit.core.console import progress
    from farmkit.lm.generation import generate
    from farmkit.lm.models import PromptFormat, load_causal_lm, load_tokenizer, resolve
    from farmkit.lm.sampling import vllm_generate_from_folder
    from farmkit.train.launch import whole_models
    from farmkit.train.rollout_backends import resolve_backend as rollout_backend

    path = resolve(policy)
    decoding = DecodingConfig(**config.decoding_fields())
    if rollout_backend(config.backend) == "vllm":
        tokenizer = load_tokenizer(path)
        texts = [
            PromptFormat.for_model(path, config.template).record_prompt(tokenizer, r)
            for r in prompts
        ]
        samples = vllm_generate_from_folder(path, texts, decoding, config.seed)
    else:
        with (
            whole_models()
        ):  # whole even after a ZeRO-3 Trainer ran in this process (expert iteration)
            network, tokenizer = load_causal_lm(path, device=device)
        network.eval()
        prompt_format = PromptFormat.for_model(path, config.template)
        texts = [prompt_format.record_prompt(tokenizer, r) for r in prompts]
        shard = (distributed.rank(), distributed.world_size())
        with progress(
            total=len(texts) * decoding.n, desc=f"sampling {decoding.n} per prompt"
        ) as bar:
            samples = generate(
                network,
                tokenizer,
                texts,
                decoding,
                seed=config.seed,
                on_batch=lambda indices, _: bar.update(len(indices) * decoding.n),
                shard=shard,
            )
        del network
    # this process's prompts (all of them in one process; a sampled prompt has n >= 1 samples)
    mine = [index for index, found in enumerate(samples) if found]
    scored = [ScoredPrompt(dict(prompts[index]), samples[index]) for index in mine]
    items = [
        (p.record["instruction"], p.record.get("input"), s.text) for p in scored for s in p.samples
    ]
    with progress(total=len(items), desc="scoring") as bar:
        # a sample cut off at max_new_tokens is scored as it is, without an end token
        rewards = scorer.score(
            items, progress=bar, finished=[s.finished for p in scored for s in p.samples]
        )
    for position, prompt in enumerate(scored):
        prompt.rewards = rewards[position * decoding.n : (position + 1) * decoding.n]
    if not distributed.launched():
        return scored
    everything: list[ScoredPrompt | None] = [None] * len(prompts)
    shares = distributed.all_gather(list(zip(mine, scored, strict=True)))
    log.debug(
        "best-of-n: sharded over %d processes (prompts per process: %s)",
        len(shares),
        ", ".join(str(len(share)) for share in shares),
    )
    for share in shares:
        for index, prompt in share:
            everything[index] = prompt
    missing = [index for index, prompt in enumerate(everything) if prompt is None]
    if missing:
        raise RuntimeError(f"no process sampled prompts {missing[:5]}")
    return everything  # type: ignore[return-value]


def _output_record(
    prompt: ScoredPrompt, index: int, generator: str, config: BestOfNConfig, reward_model: str
) -> dict[str, Any]:
    record = dict(prompt.record)
    record.update(
        {
            "input": record.get("input") or "",
            "output": prompt.samples[index].text,
            "generator": generator,
            "sample_index": index,
            "finished": prompt.samples[index].finished,
            "reward": prompt.rewards[index],
            "reward_model": reward_model,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "max_new_tokens": config.max_new_tokens,
            "seed": config.seed,
        }
    )
    return record


def best_records(
    scored: Sequence[ScoredPrompt], policy_name: str, reward_model: str, config: BestOfNConfig
) -> Iterator[dict[str, Any]]:
    """For each n in config.ns (ascending), the best of the first n samples of every prompt, in prompt
    order: output records with generator `<policy>-best-of-<n>`, best_of, reward and sample_index."""
    for n in config.ns:
        generator = f"{policy_name}-best-of-{n}"
        for prompt in scored:
            record = _output_record(prompt, prompt.best(n), generator, config, reward_model)
            record["best_of"] = n
            yield record


def all_sample_records(
    scored: Sequence[ScoredPrompt], policy_name: str, reward_model: str, config: BestOfNConfig
) -> Iterator[dict[str, Any]]:
    """Every scored sample as an output record (generator: the policy's name), prompt by prompt."""
    for prompt in scored:
        for index in range(len(prompt.samples)):
            yield _output_record(prompt, index, policy_name, config, reward_model)


def mean_rewards(scored: Sequence[ScoredPrompt], ns: Sequence[int]) -> dict[int, float]:
    """Mean reward of the selected output for each n (n=1 is the first sample's reward)."""
    return (
        {n: sum(p.rewards[p.best(n)] for p in scored) / len(scored) for n in ns} if scored else {}
    )


def sample_tokens(sample: Sample) -> int:
    """A sample's response tokens, the end token included (as the rollouts count them)."""
    return sample.completion_tokens + int(sample.finished)


def sweep_rows(
    scored: Sequence[ScoredPrompt],
    ns: Sequence[int],
    labels_used: int | None,
    elapsed_s: float,
    gold: Any = None,
    gold_scored: Sequence[ScoredPrompt] = (),
) -> list[dict[str, Any]]:
    """farm-bon's metrics rows (schemas/metrics.json), one per n: step = n, no loss; the mean reward
    and length of the selected outputs, the KL bound log n - (n - 1) / n, the budget of best-of-n
    alone (the first n samples of each prompt: one pass serves the sweep, the largest n's row counts
    the whole pass) and, with a gold judge (farmkit.train.gold), its figures for the selected
    answers to the gold prompts (`gold_scored`)."""
    from farmkit.train.gold import best_of_n_kl
    from farmkit.train.metrics import metrics_row

    rows = []
    for n in ns:
        chosen = [p.samples[p.best(n)] for p in scored]
        figures: dict[str, Any] = {
            "n": n,
            "reward": mean_rewards(scored, [n])[n],
            "kl": best_of_n_kl(n),
            "response_length": sum(sample_tokens(s) for s in chosen) / len(chosen),
            "labels_used": labels_used,
            "tokens_sampled": sum(sample_tokens(s) for p in scored for s in p.samples[:n]),
            "training_tokens": 0,
            "elapsed_s": round(elapsed_s, 2),
        }
        if gold is not None:
            answers = [p.samples[p.best(n)] for p in gold_scored]
            figures.update(
                gold.judge([s.text for s in answers], [s.finished for s in answers], f"best-of-{n}")
            )
            figures["gold_kl"] = best_of_n_kl(n)
            figures["gold_answer_length"] = sum(sample_tokens(s) for s in answers) / len(answers)
        rows.append(metrics_row("bon", n, None, **figures))
    return rows
