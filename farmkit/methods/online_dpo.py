"""Online (iterative) DPO with a farm-annotate pool in the loop.

Each round samples two answers per prompt from the current policy (at a temperature above 0), has a
pool label the pairs through farmkit's annotation engine (its cache, its prices and the run's
--max-cost), saves the labels as ordinary preference records, and trains DPO on them from the
current policy with the SFT model as the frozen reference. The run lives in OUTPUT-checkpoints/
beside OUTPUT (as farm-ppo's checkpoints): run.json (the settings its rounds were made with),
metrics.jsonl (one line a round) and, for each round, round_<r>/:

    preferences.jsonl   the round's labels (preference records, exactly as farm-annotate writes them)
    labels.json         what labelling them took (requests, cache hits, price...), written after them
    policy/             the policy after the round's DPO steps (a model folder, farmkit.lm.modelio)
    optimizer.pt        the AdamW state after it (the two newest rounds keep theirs): the next
                        round continues it, on one learning-rate schedule over all the rounds
    round.json          the round's metrics line, written last: the round is finished

A rerun with the same settings takes finished rounds as they are, trains a round whose labels are
saved from those labels (asking nothing), and labels the rest through the cache, so nothing is paid
twice; more --rounds continue a finished run. At the end OUTPUT is written whole by farmkit.lm.modelio's
writer: the last round's policy (weights, tokenizer), metrics.jsonl and meta.json with the run's
budget accounting (and, with --gold, each round's gold figures in metrics.jsonl).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from farmkit.core.io import FarmError, atomic_path, read_records
from farmkit.core.runs import METRICS_FILE
from farmkit.core.seeds import derive_seed, stable_hash
from farmkit.core.values import AT_LEAST_ONE
from farmkit.lm.models import META_FILE
from farmkit.methods.dpo import DPOConfig
from farmkit.train.config import ROLLOUT_BACKENDS, config_dict, help_field, shared_field
from farmkit.train.metrics import metrics_row, write_metrics
from farmkit.train.tracking import tracker_dir

log = logging.getLogger("farmkit")

TOOL = "farm-online-dpo"
RUN_FILE = "run.json"  # what the rounds in OUTPUT were made with; a rerun must match it
OPTIMIZER_FILE = "optimizer.pt"  # the optimizer's state after the newest trained round
DEFAULT_POOL = "sim_ann_offline"


@dataclass
class OnlineDPOConfig(DPOConfig):
    rounds: int = help_field(
        3,
        "Rounds of sample -> label -> train; a rerun with more rounds continues the run.",
        bounds=AT_LEAST_ONE,
    )
    prompts_per_round: int = help_field(
        64,
        "Prompts sampled per round (two answers each: one pair to label per prompt).",
        bounds=AT_LEAST_ONE,
    )
    # sampling temperature of the two answers: above 0, or the two would mostly agree
    temperature: float = shared_field("temperature", 1.0)
    max_new_tokens: int = shared_field("max_new_tokens", 300)
    generation_batch_size: int = shared_field("generation_batch_size", 32)
    epochs: int = shared_field("epochs", 1)  # passes over each round's pairs
    # each round samples the previous round's saved policy: a vLLM engine loads that folder
    rollout_backend: str = shared_field("rollout_backend", "auto", ROLLOUT_BACKENDS)
    fresh_optimizer_each_round: bool = help_field(
        False,
        "A new optimizer and learning-rate schedule (warm-up, decay to 0) every round, as "
        "farm-online-dpo did before: a departure from online DPO as published, which trains one "
        "policy continuously. Default: one AdamW state and one schedule over all --rounds (the "
        "state saved beside the two newest rounds, so a rerun continues it).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lora:
            raise ValueError(
                "--lora is not available: a round continues the previous round's policy, whose "
                "adapters off would be the reference instead of the SFT model"
            )
        if self.save_steps or self.resume:
            raise ValueError(
                "save-steps and resume are not online DPO's: its rounds are the checkpoints, and "
                "running the same command again resumes it"
            )
        if self.temperature <= 0:
            raise ValueError("temperature must be positive: two greedy answers are the same answer")
        if self.generation_batch_size < 2:
            raise ValueError("generation-batch-size must be >= 2 (two answers to a prompt)")


@dataclass
class Annotation:
    """How the pool is run: farm-annotate's options."""

    pool: str = help_field(
        DEFAULT_POOL,
        "The farm-annotate pool that labels each round's pairs: a name (farm-annotate "
        "--list-pools) or a pool YAML file. The default is offline (no endpoint).",
    )
    cache: str | None = "default"  # a SQLite file, "default" or None (no cache)
    max_cost: float | None = None  # USD, over the whole run (all rounds, all reruns)
    prices: str | None = None
    flip_rate: float | None = None
    both_orders: bool = False
    models: tuple[str, ...] = ()
    device: str = "auto"


class Labeller(Protocol):
    """What labels a round's pairs: farm-online-dpo passes farm-annotate's pool run over the
    Annotation settings (farmkit.annotate.run.PoolLabeller)."""

    def __call__(
        self, pairs: list[dict[str, Any]], seed: int, budget: float | None, folder: Path
    ) -> dict[str, Any] | None:
        """Label the pair records into folder/preferences.jsonl (preference records, as
        farm-annotate writes them), within `budget` USD (None: no cap); return what it took
        (labels.json: pairs, requests, judge_calls, cache_hits, price, budget_cut, ...), or None
        when the budget pays for no pair."""


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _write_json(path: Path, value: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(value, indent=1) + "\n")


def steps_per_round(config: OnlineDPOConfig) -> int:
    """Optimizer steps a round takes when all its prompts give a pair (transformers' count): the
    run's schedule spans --rounds of them (rounds with ties train fewer, so it ends a little above
    0)."""
    if config.max_steps > 0:
        return config.max_steps
    batches = math.ceil(config.prompts_per_round / config.batch_size)
    return math.ceil(config.epochs * max(1, batches // config.gradient_accumulation_steps))


def _drop_old_optimizer_states(run_folder: Path, finished: int) -> None:
    """Keep the optimizer states of the rounds `finished` and `finished - 1` only (a state is twice
    the model's size): a rerun of the last round (its round.json removed) continues the one before."""
    for state in run_folder.glob(f"round_*/{OPTIMIZER_FILE}"):
        if int(state.parent.name.split("_")[1]) < finished - 1:
            state.unlink()


def round_seed(seed: int, number: int) -> int:
    return derive_seed(seed, "online-dpo round", number)


def fingerprint(
    sft: str, prompts_hash: str, config: OnlineDPOConfig, annotation: Annotation, seed: int
) -> dict[str, Any]:
    """What decides a round's samples, labels and training; --rounds, --max-cost, the cache and the
    price table do not (a rerun may change them)."""
    settings = {
        key: value
        for key, value in config_dict(config).items()
        # nor does the gold judge, which only watches
        if key not in ("rounds", "generation_batch_size", "gold", "gold_prompts", "gold_size")
    }
    return {
        "sft": str(Path(sft).resolve()) if Path(sft).is_dir() else sft,
        "prompts": prompts_hash,
        "seed": seed,
        "config": settings,
        "pool": annotation.pool,
        "flip_rate": annotation.flip_rate,
        "both_orders": annotation.both_orders,
        "models": list(annotation.models),
    }


def rounds_folder(output: str | os.PathLike) -> Path:
    """Where a run's rounds live: OUTPUT-checkpoints beside OUTPUT (the policy folder)."""
    return Path(f"{str(output).rstrip('/')}-checkpoints")


def _check_run(out: Path, expected: dict[str, Any]) -> None:
    if (out / RUN_FILE).is_file() or any(out.glob("round_*")):
        raise FarmError(
            f"{out}: holds the rounds of a run written before they moved to "
            f"{rounds_folder(out).name}/; move round_*, {RUN_FILE} and {METRICS_FILE} there, or "
            "use another -o"
        )
    output = rounds_folder(out)
    found = _read_json(output / RUN_FILE)
    if found is None:
        if any(output.glob("round_*")):
            raise FarmError(f"{output}: holds rounds but no {RUN_FILE}; use another -o")
        output.mkdir(parents=True, exist_ok=True)
        _write_json(output / RUN_FILE, expected)
        return
    if found != expected:
        changed = sorted(
            key
            for key in set(found) | set(expected)
            if json.dumps(found.get(key), sort_keys=True)
            != json.dumps(expected.get(key), sort_keys=True)
        )
        raise FarmError(
            f"{output}: its rounds were made with other settings ({', '.join(changed)}); "
            "rerun with the same ones to continue, or write to another -o"
        )


def _sample_pairs(
    policy: str,
    sft: str,
    records: list[dict[str, Any]],
    config: OnlineDPOConfig,
    seed: int,
    generator: str,
) -> tuple[list[dict[str, Any]], int]:
    """Two answers per record from `policy`, as pair records to label; and the tokens sampled."""
    import torch

    from farmkit.lm.generation import DecodingConfig, generate, plain_generation_config
    from farmkit.lm.models import PromptFormat, load_causal_lm, load_tokenizer
    from farmkit.lm.sampling import vllm_generate_from_folder
    from farmkit.train.rollout_backends import resolve_backend as rollout_backend

    decoding = DecodingConfig(
        n=2,
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens,
        batch_size=config.generation_batch_size,
    )
    fmt = PromptFormat.for_model(sft, config.template)  # the prompt DPO trains on
    if rollout_backend(config.rollout_backend) == "vllm":
        tokenizer = load_tokenizer(policy)
        prompts = [fmt.record_prompt(tokenizer, record) for record in records]
        # in fp32, as the RL rollouts' engine: the precision the policy trains in
        samples = vllm_generate_from_folder(policy, prompts, decoding, seed, dtype="float32")
    else:
        # in fp32 and from exactly softmax(logits / temperature), as the RL rollouts sample: the
        # model's generation_config (repetition_penalty, top_k, ...) is set aside
        model, tokenizer = load_causal_lm(policy, device="auto", dtype="float32")
        prompts = [fmt.record_prompt(tokenizer, record) for record in records]
        with plain_generation_config(model, tokenizer):
            samples = generate(model, tokenizer, prompts, decoding, seed=seed)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    pairs, tokens = [], 0
    for record, (first, second) in zip(records, samples, strict=True):
        pair = {
            "instruction": record["instruction"],
            "input": record.get("input") or "",
            "output_1": first.text,
            "output_2": second.text,
            "generator_1": generator,
            "generator_2": generator,
            "sample_index_1": 0,
            "sample_index_2": 1,
            # False: cut at --max-new-tokens; DPO then trains the answer without an end token
            "finished_1": first.finished,
            "finished_2": second.finished,
        }
        for key in ("id", "messages", "dataset"):
            if key in record:
                pair[key] = record[key]
        pairs.append(pair)
        tokens += first.completion_tokens + second.completion_tokens
    return pairs, tokens


def _dpo_summary(policy: Path) -> dict[str, Any]:
    """First and last logged DPO loss, reward margin and accuracy of a round's training."""
    path = policy / METRICS_FILE
    history = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    summary: dict[str, Any] = {"dpo_steps": len(history)}
    for key, name in (
        ("loss", "dpo_loss"),
        ("rewards/margins", "reward_margin"),
        ("rewards/accuracies", "reward_accuracy"),
    ):
        values = [entry[key] for entry in history if key in entry]
        if values:
            summary[f"{name}_first"], summary[name] = values[0], values[-1]
    tokens = [entry["num_tokens"] for entry in history if "num_tokens" in entry]
    if tokens:
        summary["training_tokens"] = tokens[-1]
    return summary


def _write_run_metrics(path: Path, rounds: list[dict[str, Any]]) -> None:
    """The one metrics schema of every trainer: a step is a round, its loss the round's last DPO
    loss; labels_used, tokens_sampled and training_tokens are running totals over the run."""
    totals = {"labels_used": 0, "tokens_sampled": 0, "training_tokens": 0}
    elapsed = 0.0
    rows = []
    for entry in rounds:
        for key in totals:
            totals[key] += int(entry.get(key) or 0)
        elapsed += float(entry.get("seconds") or 0)
        figures = {k: v for k, v in entry.items() if k != "annotation" and k not in totals}
        rows.append(
            metrics_row(
                "online-dpo",
                entry["round"],
                entry.get("dpo_loss"),
                **figures,
                **totals,
                elapsed_s=round(elapsed, 3),
            )
        )
    write_metrics(path, rows)


def train_online_dpo(
    sft: str,
    records: list[dict[str, Any]],
    output: str,
    config: OnlineDPOConfig,
    annotation: Annotation,
    label: Labeller,
    seed: int = 0,
    inputs: list[str] | None = None,
    gold_pools: Any = None,
) -> dict[str, Any]:
    """Run (or continue) the rounds, `label` labelling each round's pairs (with the pool and
    settings `annotation` names); returns the budget accounting written to meta.json.
    `gold_pools`: the loader of annotator pools a --gold name is looked up in
    (farmkit.annotate.run.gold_pool)."""
    # One process only: not rank-aware (under a launcher every process would sample, pay the judges
    # for the same pairs and write the rounds), and its DPO rounds would not be the DeepSpeed run
    # launched. Refused before any work, never N copies of the run.
    from farmkit.train.launch import deepspeed_launched

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise FarmError(
            f"farm-online-dpo runs as one process (launched with WORLD_SIZE={os.environ['WORLD_SIZE']}): "
            "every process would sample, pay the judges and write the rounds; run it without "
            "torchrun or accelerate launch"
        )
    if deepspeed_launched():
        raise FarmError(
            "farm-online-dpo does not run under DeepSpeed: run it as one process, without "
            "accelerate launch --use_deepspeed"
        )
    from farmkit.lm.modelio import model_meta
    from farmkit.lm.models import PromptFormat, file_sha256, load_tokenizer, resolve
    from farmkit.methods.dpo import Continuation, dpo_pairs, train_dpo
    from farmkit.train.rollouts import prompt_order

    if not records:
        raise FarmError("no prompts to train on")
    started = time.perf_counter()
    out = Path(output)
    prompts_hash = stable_hash(
        [[r["instruction"], r.get("input") or "", r.get("messages")] for r in records]
    )
    _check_run(out, fingerprint(sft, prompts_hash, config, annotation, seed))
    run_folder = rounds_folder(out)
    # the gold judge watches every round's policy (--gold): made before anything is sampled
    from farmkit.train.gold import GoldRequest, make_gold

    request = GoldRequest.of(
        config,
        seed=seed,
        batch_size=config.generation_batch_size,
        cache=annotation.cache,
        tool=TOOL,
        pools=gold_pools,
    )
    gold = make_gold(request, records, sft, device=annotation.device)
    order = prompt_order(len(records), config.rounds * config.prompts_per_round, seed)
    total_steps = config.rounds * steps_per_round(config)
    policy = sft
    rounds: list[dict[str, Any]] = []
    stopped = None
    for number in range(1, config.rounds + 1):
        folder = run_folder / f"round_{number}"
        finished = _read_json(folder / "round.json")
        if finished is not None:
            rounds.append(finished)
            if (folder / "policy" / META_FILE).is_file():
                policy = str(folder / "policy")
            log.info("round %d: finished before, taken as it is", number)
            continue
        round_started = time.perf_counter()
        labels = _read_json(folder / "labels.json")
        if labels is not None:
            log.info("round %d: training on its saved labels (nothing asked)", number)
        else:
            spent = sum(r["annotation"]["price"] for r in rounds)
            budget = None if annotation.max_cost is None else annotation.max_cost - spent
            chosen = [
                records[i]
                for i in order[
                    (number - 1) * config.prompts_per_round : number * config.prompts_per_round
                ]
            ]
            fresh, sampled = _sample_pairs(
                policy, sft, chosen, config, round_seed(seed, number), f"{TOOL}-round{number}"
            )
            labels = label(fresh, seed, budget, folder)
            if labels is None:
                stopped = (
                    f"--max-cost: ${budget:.4f} left of ${annotation.max_cost:.4f} pays for no pair "
                    f"of round {number}"
                )
                log.warning("%s; stopping before it", stopped)
                break
            labels["tokens_sampled"] = sampled
            _write_json(folder / "labels.json", labels)
        prefs = folder / "preferences.jsonl"
        pairs, counts = dpo_pairs(list(read_records(prefs, "preference")), str(prefs))
        entry: dict[str, Any] = {
            "round": number,
            "labels_used": labels["pairs"],  # paid for, ties and null verdicts included
            "pairs_trained": len(pairs),
            "ties": counts.get("tie", 0),
            "nulls": counts.get("null", 0),
            "annotator_requests": labels["requests"],
            "judge_calls": labels["judge_calls"],
            "cache_hits": labels["cache_hits"],
            "price": labels["price"],
            "tokens_sampled": labels["tokens_sampled"],
            "annotation": labels,
        }
        if pairs:
            continuation = None
            if not config.fresh_optimizer_each_round:
                previous = Path(policy).parent / OPTIMIZER_FILE
                continuation = Continuation(
                    load_from=previous if policy != sft and previous.is_file() else None,
                    save_to=folder / OPTIMIZER_FILE,
                    done=sum(int(r.get("optimizer_steps") or 0) for r in rounds),
                    total=total_steps,
                )
            trained = train_dpo(
                sft,
                pairs,
                str(folder / "policy"),
                config,
                seed=round_seed(seed, number),
                inputs=[str(prefs)],
                counts=dict(counts),
                start_from=policy,
                tool=TOOL,
                extra_meta={"round": number},
                gold=gold,
                # the tracker's files of every round beside the output, as farm-expiter's
                tracker_dir=tracker_dir(out) / f"round-{number}",
                continuation=continuation,
            )
            policy = str(folder / "policy")
            entry["optimizer_steps"] = trained.get("optimizer_steps", 0)
            entry.update(_dpo_summary(folder / "policy"))
            entry.update({key: value for key, value in trained.items() if key.startswith("gold_")})
        else:
            log.warning("round %d: no usable pair (every label a tie or null); not trained", number)
        entry["seconds"] = round(time.perf_counter() - round_started, 3)
        _write_json(folder / "round.json", entry)
        _drop_old_optimizer_states(run_folder, number)
        rounds.append(entry)
        _write_run_metrics(run_folder / METRICS_FILE, rounds)
        loss = entry.get("dpo_loss")
        log.info(
            "round %d: %d labels used (%d trained on, %d ties, %d null), %d requests, "
            "%d cache hits, $%.4f, dpo loss %s, reward margin %s",
            number,
            entry["labels_used"],
            entry["pairs_trained"],
            entry["ties"],
            entry["nulls"],
            entry["annotator_requests"],
            entry["cache_hits"],
            entry["price"],
            "-" if loss is None else f"{entry['dpo_loss_first']:.4f} -> {loss:.4f}",
            "-" if loss is None else f"{entry.get('reward_margin', float('nan')):.4f}",
        )
        if labels.get("budget_cut"):
            stopped = f"--max-cost ${annotation.max_cost:.4f} reached in round {number}"
            log.warning("%s; stopping after it", stopped)
            break
    _write_run_metrics(run_folder / METRICS_FILE, rounds)
    if policy == sft:
        raise FarmError(
            f"{output}: no round was trained ({stopped or 'every label a tie or null'})"
        )
    # the shape of every method's budget (farmkit.train.budget), then online DPO's own figures
    budget = {
        "labels_used": sum(r["labels_used"] for r in rounds),
        "tokens_sampled": sum(r["tokens_sampled"] for r in rounds),
        "training_tokens": sum(int(r.get("training_tokens") or 0) for r in rounds),
        "wall_seconds": round(sum(r["seconds"] for r in rounds), 3),
        "max_cost": annotation.max_cost,
        "spent": sum(r["price"] for r in rounds),
        "rounds": len(rounds),
        "pairs_trained": sum(r.get("pairs_trained", 0) for r in rounds),
        "annotator_requests": sum(r["annotator_requests"] for r in rounds),
        "judge_calls": sum(r["judge_calls"] for r in rounds),
        "cache_hits": sum(r["cache_hits"] for r in rounds),
        "this_run_seconds": round(time.perf_counter() - started, 3),
        "stopped": stopped,
    }
    tokenizer = load_tokenizer(resolve(sft))
    meta = model_meta(
        TOOL,
        "policy",
        sft,
        PromptFormat.for_model(sft, config.template).resolved(tokenizer),
        seed,
        config_dict(config),
        {path: file_sha256(path) for path in inputs or []},
        pool=annotation.pool,
        policy_round=int(Path(policy).parent.name.split("_")[1]),
        budget=budget,
        gold=gold.block() if gold is not None else None,
    )
    from farmkit.lm.modelio import copy_model_folder

    copy_model_folder(
        policy, out, meta, skip=(METRICS_FILE,), extra_files=[run_folder / METRICS_FILE]
    )
    return budget
