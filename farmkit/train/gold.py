"""--gold POOL_OR_RM: every policy method scores its checkpoints with a second, "gold" judge, so that
an over-optimization curve (gold against KL, or against the surrogate reward; Gao et al. 2023) comes
from any run, not only from the recipe.

What is judged: one answer per held-out prompt, sampled from the checkpoint. The prompts are
--gold-prompts FILE (instruction records, the first --gold-size of them), or by default the first
--gold-size distinct prompts of the method's training input (a fixed slice of it, so the same prompts
at every checkpoint and in every method fed the same file; they are not held out from training unless
--gold-prompts names other prompts). Each checkpoint answers them with the same seed, at the method's
sampling temperature, from exactly the tempered policy (farmkit.train.policy.sample_rollout, as the
rollouts sample): a difference between two checkpoints comes from the policy, not from the draw.

The reference: the starting model's (SFT's) answers to the same prompts, sampled once per run with
another seed (`gold reference`). Every method started from one SFT model with one seed, one
temperature and the same prompts compares with the same reference answers.

The gold judge:
- a reward model folder (meta.json kind reward_model): scored with RewardScorer, as the methods score
  their surrogate. `gold_reward` is its mean score of the answers; `gold_win_rate` the share of prompts
  (in percent, ties half) whose answer it scores above the reference answer;
- otherwise an annotator pool, a farm-annotate --pool name or YAML file (the offline `gold` pool: the
  gold oracle): each answer judged against the reference answer (the reference in position 1, as
  farm-winrate reads it) through farm-annotate's engine and cache. `gold_win_rate` is farm-winrate's
  win rate (percent, ties half, null verdicts left out), `gold_win_rate_se` its standard error. The pool is asked through a PoolJudge that
  the caller's `pools` loader builds (farmkit.annotate.run.gold_pool): this layer sits below the
  annotate pillar and never imports it.
Beside them, `gold_kl` is the KL of the checkpoint to the starting model measured on those answers
(mean over answers of the summed per-token log-ratio, the k1 estimate at the sampling temperature; for
best-of-n, which has no policy to measure, the analytic bound log n - (n - 1) / n), and
`gold_answer_length` the answers' mean length in tokens (the end token included, as PPO's
response_length). They go into the method's metrics.jsonl row of that checkpoint.

--gold needs one process: under a launcher with several it is refused before training.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from farmkit.core.io import FarmError
from farmkit.core.seeds import derive_seed

log = logging.getLogger("farmkit")

GOLD_SIZE = 32
FIGURES = ("gold_win_rate", "gold_reward", "gold_kl", "gold_answer_length")


def prompt_key(record: dict[str, Any]) -> str:
    return json.dumps(
        [record["instruction"], record.get("input") or "", record.get("messages")], sort_keys=True
    )


def choose_prompts(
    training: Sequence[dict[str, Any]], prompts_file: str | None, size: int
) -> tuple[list[dict[str, Any]], str]:
    """The gold prompts and a description of where they came from: the first `size` records of
    `prompts_file`, else the first `size` distinct prompts of the training input."""
    from farmkit.core.io import display_name, read_records

    if size < 1:
        raise FarmError("--gold-size must be at least 1")
    if prompts_file:
        source = list(read_records(prompts_file, "instruction"))
        where = display_name(prompts_file)
    else:
        source, where = list(training), "the training input"
    chosen: dict[str, dict[str, Any]] = {}
    for record in source:
        key = prompt_key(record)
        if key not in chosen:
            chosen[key] = {
                field: record[field]
                for field in ("instruction", "input", "messages", "id")
                if field in record
            }
        if len(chosen) == size:
            break
    if not chosen:
        raise FarmError(f"--gold: no prompts in {where}")
    return list(chosen.values()), f"the first {len(chosen)} distinct prompts of {where}"


class PoolJudge(Protocol):
    """An annotator pool as the gold evaluation asks it (farmkit.annotate.run.GoldPool is one)."""

    def preferences(self, pairs: list[dict[str, Any]]) -> tuple[list[Any], dict[str, Any]]:
        """The preference of each pair record (None: no verdict) and what asking cost (pairs,
        requests, cache_hits, price)."""
        ...


# a --gold pool name, YAML file or learned judge folder -> its PoolJudge (FarmError when it names
# no pool), called with the run's seed, cache and device as keywords
PoolLoader = Callable[..., PoolJudge]


@dataclass(frozen=True)
class GoldRequest:
    """Everything a run's gold judge is made of but the models and the prompts it trains on
    (make_gold's one bundle): --gold, --gold-prompts, --gold-size, how the run samples, and the
    loader of annotator pools (from above this layer; None: a pool named by --gold is refused)."""

    judge: str | None
    prompts_file: str | None = None
    size: int = GOLD_SIZE
    template: str = "auto"
    temperature: float = 1.0
    max_new_tokens: int = 300
    seed: int = 0
    batch_size: int = 16
    tool: str = "farmkit"
    cache: str | None = "default"
    pools: PoolLoader | None = None

    @classmethod
    def of(cls, config: Any, **settings: Any) -> GoldRequest:
        """The request of a method's config (its GoldArgs, template, temperature and
        max_new_tokens, unless `settings` give them); `settings` give the rest."""
        sampling = {
            name: getattr(config, name)
            for name in ("template", "temperature", "max_new_tokens")
            if name not in settings
        }
        return cls(config.gold, config.gold_prompts, config.gold_size, **sampling, **settings)


def judge_kind(spec: str) -> str:
    """'reward_model' for a reward model folder, 'pool' for anything else (a learned judge folder,
    an annotator pool's name or YAML file: the pool loader says whether it names one)."""
    from farmkit.lm.models import check_reward_model, read_meta

    path = Path(spec)
    if path.is_dir():
        if read_meta(path).get("kind") == "learned_judge":
            return "pool"  # load_pool reads it as a one-judge oracle pool
        try:
            check_reward_model(path)
        except FarmError as exc:
            raise FarmError(
                f"--gold {exc}; or a learned judge folder (farm-judge-train) or an annotator pool"
            ) from None
        return "reward_model"
    return "pool"


def check_processes() -> None:
    from farmkit.core import distributed

    if distributed.world_size() > 1:
        raise FarmError(
            "--gold runs in one process: under a launcher with several, train without --gold and "
            "judge the checkpoints afterwards (farm-sample | farm-annotate --reference, or farm-score)"
        )


def best_of_n_kl(n: int) -> float:
    """KL of best-of-n to the policy it samples from, the analytic bound (Stiennon et al. 2020)."""
    return math.log(n) - (n - 1) / n


class GoldEvaluator:
    """The gold judge of one run: its prompts, the reference answers (sampled once) and the tally of
    what judging cost. `start` is the starting model (its folder or name); `start_network` the
    method's frozen copy of it when it holds one (else it is loaded when first needed)."""

    def __init__(
        self,
        spec: str,
        prompts: list[dict[str, Any]],
        source: str,
        start: str,
        *,
        template: str = "auto",
        temperature: float = 1.0,
        max_new_tokens: int = 300,
        seed: int = 0,
        device: str = "auto",
        batch_size: int = 16,
        cache: str | None = "default",
        start_network: Any = None,
        tool: str = "farmkit",
        pools: PoolLoader | None = None,
    ) -> None:
        check_processes()
        if temperature <= 0:
            raise FarmError("--gold samples its answers: the temperature must be above 0")
        self.spec, self.kind = spec, judge_kind(spec)
        self.prompts, self.source = prompts, source
        self.start, self.template, self.tool = start, template, tool
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.seed, self.device, self.batch_size, self.cache = seed, device, batch_size, cache
        self._start_network = start_network
        self._start_tokenizer: Any = None
        self._reference: tuple[list[str], list[bool]] | None = None
        self._reference_scores: list[float] | None = None
        self.scorer: Any = None
        self.pool: PoolJudge | None = None
        if self.kind == "reward_model":
            from farmkit.train.scoring import RewardScorer

            self.scorer = RewardScorer(spec, device=device, batch_size=batch_size)
            self.scorer.network.requires_grad_(False)
        elif pools is None:
            raise FarmError(
                f"--gold {spec}: not a reward model folder, and no annotator pools to look it up in "
                "(pass pools=farmkit.annotate.run.gold_pool)"
            )
        else:  # loaded (and its endpoint checked) before training, not at the first checkpoint
            self.pool = pools(spec, seed=seed, cache=cache, device=device)
        self.evaluations = 0
        self.tokens_sampled = 0
        self.seconds = 0.0
        self.annotation = {"pairs": 0, "requests": 0, "cache_hits": 0, "price": 0.0}
        log.info("gold judge %s (%s) on %s", spec, self.kind.replace("_", " "), source)

    # -- the models' answers -------------------------------------------------------------------

    def _format(self) -> Any:
        from farmkit.lm.models import PromptFormat

        # no control token of the start folder's own: the caller says which one to sample behind
        return PromptFormat(template=PromptFormat.for_model(self.start, self.template).template)

    def _start_model(self) -> tuple[Any, Any]:
        from farmkit.lm.models import load_causal_lm, load_tokenizer, resolve
        from farmkit.train.launch import whole_models
        from farmkit.train.rollouts import TRAINING_DTYPE

        if self._start_network is None:
            with whole_models():
                network, tokenizer = load_causal_lm(
                    self.start, device=self.device, dtype=TRAINING_DTYPE
                )
            network.requires_grad_(False)
            network.eval()
            self._start_network, self._start_tokenizer = network, tokenizer
        if self._start_tokenizer is None:
            self._start_tokenizer = load_tokenizer(resolve(self.start))
        return self._start_network, self._start_tokenizer

    def _sample(
        self,
        network: Any,
        tokenizer: Any,
        purpose: str,
        control: str | None = None,
        suppress: Sequence[int] = (),
    ) -> list[Any]:
        """One answer per gold prompt from `network` (seeded by purpose), in rollouts of batch_size."""
        import torch

        from farmkit.train import policy as P

        fmt = self._format()
        texts = [fmt.record_prompt(tokenizer, record, control) for record in self.prompts]
        rollouts = []
        was_training = network.training
        network.eval()
        try:
            for start in range(0, len(texts), self.batch_size):
                torch.manual_seed(derive_seed(self.seed, purpose, start))
                rollout = P.sample_rollout(
                    network,
                    tokenizer,
                    texts[start : start + self.batch_size],
                    self.temperature,
                    self.max_new_tokens,
                    suppress,
                )
                rollouts.append(rollout)
                self.tokens_sampled += int(rollout.response_mask.sum())
        finally:
            network.train(was_training)
        return rollouts

    def reference(self) -> tuple[list[str], list[bool]]:
        """The starting model's answers (texts, finished), sampled once."""
        if self._reference is None:
            from farmkit.train import policy as P

            network, tokenizer = self._start_model()
            texts, finished = [], []
            for rollout in self._sample(network, tokenizer, "gold reference"):
                texts += P.decode_responses(tokenizer, rollout)
                finished += rollout.finished.tolist()
            self._reference = (texts, finished)
        return self._reference

    # -- judging -------------------------------------------------------------------------------

    def evaluate(
        self,
        network: Any,
        tokenizer: Any,
        label: str,
        control: str | None = None,
        suppress: Sequence[int] = (),
    ) -> dict[str, float | None]:
        """Gold figures of a policy in memory (a checkpoint): its answers to the gold prompts judged
        against the reference answers, and its KL to the starting model on those answers.
        `control`: a control token the policy samples behind (Quark), which the starting model does
        not know: its log-probabilities are read on the plain prompt."""
        import torch

        from farmkit.train import policy as P

        started = time.perf_counter()
        self.reference()
        start_network, start_tokenizer = self._start_model()
        rollouts = self._sample(network, tokenizer, "gold answers", control, suppress)
        texts, finished, kls, lengths = [], [], [], []
        fmt = self._format()
        start_vocab = start_network.get_output_embeddings().weight.shape[0]
        start_device = next(start_network.parameters()).device
        with torch.no_grad():
            for number, rollout in enumerate(rollouts):
                texts += P.decode_responses(tokenizer, rollout)
                finished += rollout.finished.tolist()
                mask = rollout.response_mask
                lengths += mask.sum(dim=1).tolist()
                logits = P.response_logits(network, rollout, self.temperature)[..., :start_vocab]
                policy_logprobs = P.token_logprobs(logits, rollout.response_ids)
                plain = rollout
                if control:
                    records = self.prompts[number * self.batch_size :][: len(mask)]
                    prompt_ids = [
                        start_tokenizer(
                            fmt.record_prompt(start_tokenizer, record), add_special_tokens=False
                        )["input_ids"]
                        for record in records
                    ]
                    responses = [
                        row[keep.bool()].tolist()
                        for row, keep in zip(rollout.response_ids, mask, strict=True)
                    ]
                    plain = P.rollout_from_lists(
                        prompt_ids, responses, start_tokenizer.pad_token_id, start_device
                    )
                start_logprobs = P.token_logprobs(
                    P.response_logits(start_network, plain.to(start_device), self.temperature),
                    plain.response_ids.to(start_device),
                ).to(policy_logprobs.device)
                width = min(policy_logprobs.shape[1], start_logprobs.shape[1])
                log_ratio = (policy_logprobs[:, :width] - start_logprobs[:, :width]) * mask[
                    :, :width
                ]
                kls += log_ratio.sum(dim=1).tolist()
        figures = self.judge(texts, finished, label)
        figures["gold_kl"] = sum(kls) / len(kls)
        figures["gold_answer_length"] = sum(lengths) / len(lengths)
        self.seconds += time.perf_counter() - started
        log.info("gold %s: %s", label, describe(figures))
        return figures

    def evaluate_folder(self, folder: str | Path, label: str) -> dict[str, float | None]:
        """evaluate() of a saved policy folder (loaded whole, released after), sampled as
        farm-sample samples it (behind its meta.json's control token, if it has one)."""
        from farmkit.lm.models import PromptFormat, load_causal_lm
        from farmkit.train.launch import whole_models
        from farmkit.train.rollouts import TRAINING_DTYPE

        with whole_models():
            network, tokenizer = load_causal_lm(folder, device=self.device, dtype=TRAINING_DTYPE)
        control = PromptFormat.for_model(folder).control
        suppress = tokenizer.convert_tokens_to_ids([control]) if control else []
        try:
            return self.evaluate(network, tokenizer, label, control=control, suppress=suppress)
        finally:
            del network

    def judge(self, texts: list[str], finished: list[bool], label: str) -> dict[str, float | None]:
        """gold_win_rate (and gold_reward for a reward model) of answers to the gold prompts, in
        order, against the reference answers."""
        if len(texts) != len(self.prompts):
            raise ValueError(f"{len(texts)} answers for {len(self.prompts)} gold prompts")
        started = time.perf_counter()
        reference, reference_finished = self.reference()
        self.evaluations += 1
        if self.kind == "reward_model":
            figures = self._judge_with_reward_model(texts, finished, reference, reference_finished)
        else:
            figures = self._judge_with_pool(texts, reference, label)
        self.seconds += time.perf_counter() - started
        return figures

    def _judge_with_reward_model(
        self,
        texts: list[str],
        finished: list[bool],
        reference: list[str],
        reference_finished: list[bool],
    ) -> dict[str, float | None]:
        def items(answers: list[str]) -> list[tuple[str, str, str]]:
            return [
                (record["instruction"], record.get("input") or "", answer)
                for record, answer in zip(self.prompts, answers, strict=True)
            ]

        if self._reference_scores is None:
            self._reference_scores = self.scorer.score(
                items(reference), finished=reference_finished
            )
        scores = self.scorer.score(items(texts), finished=finished)
        wins = [
            1.0 if mine > theirs else 0.5 if mine == theirs else 0.0
            for mine, theirs in zip(scores, self._reference_scores, strict=True)
        ]
        return {**win_rate_figures(wins), "gold_reward": sum(scores) / len(scores)}

    def _judge_with_pool(
        self, texts: list[str], reference: list[str], label: str
    ) -> dict[str, float | None]:
        pairs = [
            {
                "instruction": record["instruction"],
                "input": record.get("input") or "",
                "output_1": theirs,
                "output_2": mine,
                "generator_1": "gold-reference",
                "generator_2": f"{self.tool}-{label}",
                **({"messages": record["messages"]} if "messages" in record else {}),
            }
            for record, mine, theirs in zip(self.prompts, texts, reference, strict=True)
        ]
        preferences, cost = self.pool.preferences(pairs)
        for name in self.annotation:
            self.annotation[name] += cost[name]
        verdicts = [preference for preference in preferences if preference is not None]
        if not verdicts:
            log.warning("gold judge %s: no verdict on %d pairs", self.spec, len(pairs))
            return {"gold_win_rate": None}
        return win_rate_figures([v - 1 for v in verdicts])

    def block(self) -> dict[str, Any]:
        """meta.json's `gold`: what the gold judge was, on what, and what judging cost."""
        block: dict[str, Any] = {
            "judge": str(Path(self.spec).resolve()) if Path(self.spec).is_dir() else self.spec,
            "kind": self.kind,
            "prompts": len(self.prompts),
            "prompts_from": self.source,
            "reference": self.start,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "evaluations": self.evaluations,
            "tokens_sampled": self.tokens_sampled,
            "seconds": round(self.seconds, 3),
        }
        if self.kind == "pool":
            block["annotation"] = dict(self.annotation)
        return block

    COUNTERS = ("evaluations", "tokens_sampled", "seconds", "annotation")

    def counters(self) -> dict[str, Any]:
        """What judging has cost so far and the starting model's answers (sampled, and counted,
        once), for a resume state; `restore` puts them back."""
        return {
            **{name: getattr(self, name) for name in self.COUNTERS},
            "reference": list(self._reference) if self._reference is not None else None,
        }

    def restore(self, counters: dict[str, Any]) -> None:
        for name in self.COUNTERS:
            if name in counters:
                setattr(self, name, counters[name])
        if counters.get("reference") is not None:
            texts, finished = counters["reference"]
            self._reference = (list(texts), list(finished))

    def release_start(self) -> None:
        """Forget a starting model this evaluator loaded (a method that needs the memory back)."""
        self._start_network = None


def win_rate_figures(wins: Sequence[float]) -> dict[str, float | None]:
    """gold_win_rate, the mean of the answers' wins (1 a win, 0.5 a tie, 0 a loss) in percent, and
    gold_win_rate_se, its standard error (the wins' sample standard deviation over the square root
    of their count, as farm-winrate's; None for a single answer)."""
    count = len(wins)
    mean = sum(wins) / count
    spread = math.sqrt(sum((w - mean) ** 2 for w in wins) / (count - 1)) if count > 1 else None
    return {
        "gold_win_rate": 100 * mean,
        "gold_win_rate_se": None if spread is None else 100 * spread / math.sqrt(count),
    }


def describe(figures: dict[str, Any]) -> str:
    """Gold figures for a log line."""
    return ", ".join(
        f"{name.removeprefix('gold_').replace('_', ' ')} "
        + ("-" if figures[name] is None else f"{figures[name]:.4g}")
        for name in FIGURES
        if name in figures
    )


def make_gold(
    request: GoldRequest,
    training: Sequence[dict[str, Any]],
    start: str,
    device: str = "auto",
    start_network: Any = None,
) -> GoldEvaluator | None:
    """The run's GoldEvaluator, or None without --gold: `training` the prompts the method trains on
    (the gold prompts' default), `start` the starting model (`start_network` its frozen copy when the
    method holds one)."""
    if not request.judge:
        if request.prompts_file:
            log.warning("--gold-prompts without --gold: no gold judge, the prompts are not used")
        return None
    prompts, source = choose_prompts(training, request.prompts_file, request.size)
    return GoldEvaluator(
        request.judge,
        prompts,
        source,
        start,
        template=request.template,
        temperature=request.temperature,
        max_new_tokens=request.max_new_tokens,
        seed=request.seed,
        device=device,
        batch_size=request.batch_size,
        cache=request.cache,
        start_network=start_network,
        tool=request.tool,
        pools=request.pools,
    )
