"""Quark, in the top-quantile form AlpacaFarm found best.

Each round: sample responses to a fresh set of prompts (round 0 from the SFT model as it is, later
rounds from the policy conditioned on the best-quantile control token), score them with the reward
model, rank them into quantiles, and train on them: the log-likelihood of each kept response given
its prompt and its quantile's control token, minus kl_coef * KL(policy || SFT) per token. The pool
is emptied after every round (AlpacaFarm's choice over Quark's growing pool). With keep=top only the
best quantile is trained on (AlpacaFarm's variant); keep=all trains on every quantile with its own
token, as the original Quark does. The saved policy samples with the best-quantile token, which
meta.json records as `sampling_control_token` (farm-sample adds it through PromptFormat).
"""

from __future__ import annotations

import json
import logging
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.methods.config import config_dict, help_field
from farmkit.models import TEMPLATES

log = logging.getLogger("farmkit")
KEEP = ("top", "all")
UNFINISHED = ("truncate", "penalty")


def quantile_token(quantile: int) -> str:
    """Control token of a reward quantile; quantile 0 is the best."""
    return f"<|reward_quantile_{quantile}|>"


@dataclass
class QuarkConfig:
    rounds: int = help_field(4, "Rounds of sample, score, rank, train; the rollout pool is reset every round.")
    prompts_per_round: int = help_field(64, "Prompts sampled per round.")
    samples_per_prompt: int = help_field(4, "Responses sampled per prompt per round.")
    num_quantiles: int = help_field(5, "Reward quantiles the responses of a round are ranked into.")
    keep: str = help_field("top", "Train on the top quantile only (AlpacaFarm's variant) or on all quantiles, each with its own control token (original Quark).", KEEP)
    epochs_per_round: int = help_field(2, "Passes over a round's kept responses.")
    learning_rate: float = help_field(1e-5, "Learning rate (AdamW, constant).")
    batch_size: int = help_field(8, "Responses per optimizer step.")
    kl_coef: float = help_field(0.05, "Weight of the per-token KL(policy || SFT) penalty.")
    temperature: float = help_field(0.7, "Sampling temperature of the rollouts.")
    max_response_tokens: int = help_field(300, "Longest response sampled, in tokens.")
    unfinished: str = help_field("truncate", "A response that hits max-response-tokens without its end token: 'truncate' scores the truncated text as it is; 'penalty' scores it unfinished-penalty.", UNFINISHED)
    unfinished_penalty: float = help_field(-1.0, "The score of an unfinished response under --unfinished penalty.")
    generation_batch_size: int = help_field(16, "Prompts per generate() call.")
    reward_batch_size: int = help_field(16, "Texts per reward-model forward pass.")
    template: str = help_field("auto", "Prompt template (auto: what the SFT model's meta.json says, else chat if its tokenizer has one).", TEMPLATES)

    def __post_init__(self) -> None:
        for name in ("rounds", "prompts_per_round", "samples_per_prompt", "epochs_per_round", "batch_size",
                     "max_response_tokens", "generation_batch_size", "reward_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1")
        if self.num_quantiles < 2:
            raise ValueError("num-quantiles must be at least 2")
        if self.prompts_per_round * self.samples_per_prompt < self.num_quantiles:
            raise ValueError("a round needs at least one response per quantile: raise prompts-per-round or samples-per-prompt")
        if self.learning_rate <= 0 or self.temperature <= 0 or self.kl_coef < 0:
            raise ValueError("learning-rate and temperature must be positive, kl-coef >= 0")


def assign_quantiles(scores: list[float], num_quantiles: int) -> list[int]:
    """Quantile of each score within its round (0 = best), equal-sized up to rounding; ties keep
    their sampling order so that the split is deterministic."""
    order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
    quantiles = [0] * len(scores)
    for rank, index in enumerate(order):
        quantiles[index] = rank * num_quantiles // len(scores)
    return quantiles


def train_quark(sft: str, reward_model: str, prompts: list[dict[str, Any]], output: str, config: QuarkConfig,
                seed: int = 0, inputs: list[str] | None = None) -> list[dict[str, Any]]:
    """Train with Quark and write the policy folder to `output`; returns the per-round metrics."""
    import torch

    from farmkit.methods import policy as P
    from farmkit.methods.reward import RewardScorer
    from farmkit.methods.rl_common import masked_mean
    from farmkit.models import PromptFormat, choose_device, load_causal_lm

    device = choose_device()
    torch.manual_seed(seed)
    model, tokenizer = load_causal_lm(sft, device=device, dtype="float32")
    reference, _ = load_causal_lm(sft, device=device)
    reference.requires_grad_(False)
    scorer = RewardScorer(reward_model, device=device, batch_size=config.reward_batch_size)
    scorer.network.requires_grad_(False)
    tokens = [quantile_token(q) for q in range(config.num_quantiles)]
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    model.resize_token_embeddings(len(tokenizer))  # new rows start at the mean embedding
    token_ids = tokenizer.convert_tokens_to_ids(tokens)
    reference_vocab = reference.get_output_embeddings().weight.shape[0]
    for network in (model, reference, scorer.network):
        P.disable_dropout(network)
        network.eval()

    fmt = PromptFormat.for_model(sft, config.template)
    plain_prompts = [fmt.prompt(tokenizer, r["instruction"], r.get("input")) for r in prompts]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    rng = random.Random(seed)
    order: list[int] = []
    history: list[dict[str, Any]] = []
    started = time.time()
    for round_number in range(config.rounds):
        while len(order) < config.prompts_per_round:
            epoch = list(range(len(prompts)))
            rng.shuffle(epoch)
            order.extend(epoch)
        chosen, order = order[: config.prompts_per_round], order[config.prompts_per_round :]
        chosen = [index for index in chosen for _ in range(config.samples_per_prompt)]
        # round 0 samples the SFT model itself; later rounds ask the policy for its best quantile
        control = tokens[0] if round_number > 0 else ""
        pool = []
        for start in range(0, len(chosen), config.generation_batch_size):
            indices = chosen[start : start + config.generation_batch_size]
            torch.manual_seed((seed * 1_000_003 + round_number * 1_009 + start) % 2**63)
            rollout = P.sample_rollout(model, tokenizer, [plain_prompts[i] + control for i in indices],
                                       config.temperature, config.max_response_tokens)
            texts = P.decode_responses(tokenizer, rollout)
            scores = scorer.score([(prompts[i]["instruction"], prompts[i].get("input"), text) for i, text in zip(indices, texts, strict=True)])
            for row, index in enumerate(indices):
                response = rollout.response_ids[row][rollout.response_mask[row].bool()].tolist()
                finished = bool(rollout.finished[row])
                score = float(scores[row]) if finished or config.unfinished == "truncate" else config.unfinished_penalty
                pool.append({"prompt": index, "response": response, "reward": float(scores[row]), "score": score})
        quantiles = assign_quantiles([item["score"] for item in pool], config.num_quantiles)
        kept = [(item, q) for item, q in zip(pool, quantiles, strict=True) if config.keep == "all" or q == 0]
        top = [item["score"] for item, q in zip(pool, quantiles, strict=True) if q == 0]

        losses, kls = [], []
        for epoch in range(config.epochs_per_round):
            random.Random(seed * 7_919 + round_number * 31 + epoch).shuffle(kept)
            for start in range(0, len(kept), config.batch_size):
                batch = kept[start : start + config.batch_size]
                prompt_ids = [tokenizer(plain_prompts[item["prompt"]], add_special_tokens=False)["input_ids"] for item, _ in batch]
                responses = [item["response"] for item, _ in batch]
                conditioned = P.rollout_from_lists([ids + [token_ids[q]] for ids, (_, q) in zip(prompt_ids, batch, strict=True)],
                                                   responses, tokenizer.pad_token_id, device)
                plain = P.rollout_from_lists(prompt_ids, responses, tokenizer.pad_token_id, device)
                mask = conditioned.response_mask
                logits = P.response_logits(model, conditioned, 1.0)
                nll = -masked_mean(P.token_logprobs(logits, conditioned.response_ids), mask)
                with torch.no_grad():
                    reference_logp = torch.log_softmax(P.response_logits(reference, plain, 1.0), dim=-1)
                # the SFT model has no control tokens: compare over its vocabulary only
                policy_logp = torch.log_softmax(logits[..., :reference_vocab], dim=-1)
                kl = masked_mean((policy_logp.exp() * (policy_logp - reference_logp)).sum(-1), mask)
                loss = nll + config.kl_coef * kl
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(float(nll.detach()))
                kls.append(float(kl.detach()))
        metrics = {
            "round": round_number + 1,
            "reward": sum(item["reward"] for item in pool) / len(pool),
            "score": sum(item["score"] for item in pool) / len(pool),
            "top_quantile_score": sum(top) / len(top),
            "response_length": sum(len(item["response"]) for item in pool) / len(pool),
            "trained_on": len(kept),
            "nll": sum(losses) / max(1, len(losses)),
            "kl": sum(kls) / max(1, len(kls)),
            "elapsed_s": round(time.time() - started, 2),
        }
        history.append(metrics)
        log.info("round %d/%d  reward %.4f  top quantile %.4f  nll %.4f  kl %.4f", round_number + 1, config.rounds,
                 metrics["reward"], metrics["top_quantile_score"], metrics["nll"], metrics["kl"])

    meta = P.policy_meta("farm-quark", sft, fmt.resolved(tokenizer), seed, config_dict(config), inputs or [],
                         sampling_control_token=tokens[0], control_tokens=tokens)
    with tempfile.TemporaryDirectory(prefix="farm-quark-") as scratch:
        metrics_path = Path(scratch) / "metrics.jsonl"
        metrics_path.write_text("".join(json.dumps(entry) + "\n" for entry in history))
        P.save_policy(model, tokenizer, output, meta, extra_files=[metrics_path])
    return history
