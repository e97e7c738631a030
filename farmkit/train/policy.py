"""Model-side pieces that the policy-optimization methods (PPO, Quark, DPO) share: sampling rollouts
as token ids, log-probabilities and per-token values of given responses, LoRA wrapping, and writing a
policy folder with its meta.json. Reward-model scores come from farmkit.train.scoring.RewardScorer,
the same code farm-score runs."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from farmkit.core.io import FarmError
from farmkit.train.rl_common import response_mask


@dataclass
class Rollout:
    """Prompts and sampled responses as padded token ids (prompts padded on the left)."""

    prompt_ids: torch.Tensor  # [batch, prompt width]
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor  # [batch, response width]; after the end: padding
    response_mask: torch.Tensor  # float 0/1, the eos token included
    finished: torch.Tensor  # bool: the response ended with eos before the length limit
    # sampled with top-k/top-p: how many tokens each response token's truncated distribution kept
    # [batch, response width], 0 on padding (truncation_mask; replayed by replayed_logits); None:
    # sampled from the whole tempered distribution
    kept: torch.Tensor | None = None

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask.to(self.prompt_mask.dtype)], dim=1)

    def rows(self, index: Any) -> Rollout:
        return Rollout(*(_apply(self, field.name, lambda t: t[index]) for field in _FIELDS))

    def to(self, device: Any) -> Rollout:
        return Rollout(*(_apply(self, field.name, lambda t: t.to(device)) for field in _FIELDS))


_FIELDS = dataclasses.fields(Rollout)


def _apply(rollout: Rollout, name: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    value = getattr(rollout, name)
    return None if value is None else change(value)


FUSED_DEVICES = ("cpu", "cuda")  # where torch's fused AdamW kernel runs


def fused_adamw() -> bool:
    """Whether AdamW takes torch's fused kernel where the device has one (the default);
    FARMKIT_FUSED_ADAMW=0 gives torch's own default back (the single-tensor loop on the CPU)."""
    return os.environ.get("FARMKIT_FUSED_ADAMW", "1") != "0"


def trainer_optim(device: str) -> str:
    """TrainingArguments.optim for the Trainer-based tools (farm-sft, farm-dpo) on `device`: the
    fused AdamW where the device has it, as `adamw` (a DeepSpeed config without an optimizer of
    its own, like the shipped ones, wraps this one)."""
    fused = fused_adamw() and device.split(":")[0] in FUSED_DEVICES
    return "adamw_torch_fused" if fused else "adamw_torch"


def adamw(parameters: Sequence[torch.nn.Parameter], **options: Any) -> torch.optim.AdamW:
    """torch's AdamW with its fused kernel where the parameters' device has one (CPU and CUDA), as
    transformers' Trainer defaults to (`adamw_torch_fused`): on the CPU it takes 0.09-0.17 CPU s per
    step on the embedded model's 135M parameters, against 0.6 s for the default per-tensor loop
    (bench/bench_optim.py). The same update to float rounding; FARMKIT_FUSED_ADAMW=0 turns it off."""
    parameters = list(parameters)
    fused = (
        fused_adamw()
        and bool(parameters)
        and all(
            p.device.type in FUSED_DEVICES
            and p.dtype in (torch.float32, torch.bfloat16, torch.float16)
            for p in parameters
        )
    )
    return torch.optim.AdamW(parameters, fused=fused or None, **options)


def rollout_from_lists(
    prompts: Sequence[list[int]],
    responses: Sequence[list[int]],
    pad_token_id: int,
    device: Any = "cpu",
) -> Rollout:
    """Pad token-id lists into a Rollout: prompts on the left, responses (eos included) on the right."""
    prompt_width = max(len(ids) for ids in prompts)
    response_width = max(1, max(len(ids) for ids in responses))
    prompt_ids = torch.tensor([[pad_token_id] * (prompt_width - len(ids)) + ids for ids in prompts])
    prompt_mask = torch.tensor(
        [[0] * (prompt_width - len(ids)) + [1] * len(ids) for ids in prompts]
    )
    response_ids = torch.tensor(
        [ids + [pad_token_id] * (response_width - len(ids)) for ids in responses]
    )
    mask = torch.tensor(
        [[1.0] * len(ids) + [0.0] * (response_width - len(ids)) for ids in responses]
    )
    finished = torch.ones(len(responses), dtype=torch.bool)
    return Rollout(prompt_ids, prompt_mask, response_ids, mask, finished).to(device)


def disable_dropout(model: Any) -> None:
    """Rollout and update must see the same function of the weights: no dropout anywhere."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def fit_rollout_prompts(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int, reserve: int = 0
) -> list[list[int]]:
    """Token ids of the prompts a method samples from, each left-truncated (with a warning) to what the
    model's context holds beside max_new_tokens and `reserve` tokens appended later (Quark's control
    token); a huge prompt is never tokenized whole. Done once per run, so each prompt warns once."""
    from farmkit.lm.generation import fit_prompts, prompt_room

    room = prompt_room(model, tokenizer, max_new_tokens)
    if room is not None and reserve:
        if room <= reserve:
            raise FarmError(
                f"max_new_tokens is {max_new_tokens}: the model's context leaves no room for a prompt"
            )
        room -= reserve
    return fit_prompts(tokenizer, prompts, room)


def pad_left(prompts: Sequence[Sequence[int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """input_ids and attention_mask of token-id prompts padded on the left."""
    width = max(len(ids) for ids in prompts)
    return {
        "input_ids": torch.tensor(
            [[pad_token_id] * (width - len(ids)) + list(ids) for ids in prompts]
        ),
        "attention_mask": torch.tensor(
            [[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts]
        ),
    }


def without_cpu_autocast(function: Any) -> Any:
    """`function` run with the CPU's autocast off (a fresh context each call: threads may share it).

    Decoding is memory-bound: on a CPU, bf16 autocast (which casts every weight again at each
    forward) gains little there (bench/bench_precision.py: 0.99 of fp32's CPU time on a loaded
    machine, 0.83 idle), so a trainer under --precision bf16 samples in the weights' own
    precision, its prefill too (the KV cache must match the decoding steps'). The trainer
    recomputes the rollout's log-probabilities under its own."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", enabled=False):
            return function(*args, **kwargs)

    return wrapper


@torch.no_grad()
@without_cpu_autocast
def sample_rollout(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]] | Sequence[str],
    temperature: float,
    max_new_tokens: int,
    suppress: Sequence[int] = (),
    compiled: bool = False,
    top_p: float = 1.0,
    top_k: int = 0,
) -> Rollout:
    """Sample one response per prompt from softmax(logits / temperature) and nothing else (seed torch
    beforehand); tokens after the first eos are padding. With `top_p` < 1 or `top_k` > 0, from that
    distribution truncated by truncation_mask, each token's kept count recorded (Rollout.kept).

    The model's own generation_config (repetition_penalty, top_k, top_p, min_new_tokens, ...) would
    otherwise reshape the distribution behind the method's back: the PPO ratio and KL assume the
    rollout came from exactly the tempered policy (truncated as asked, and replayed). It is set
    aside while sampling. Token ids in
    `suppress` (Quark's control tokens, which the reference model does not have) are never sampled:
    the method then scores responses over the rest of the vocabulary. `prompts` are token ids (from
    fit_rollout_prompts), or texts, fitted to the context here. `compiled`: a static KV cache and a
    compiled decoding step (farmkit.lm.generation.compiled_generation)."""
    from farmkit.lm.generation import (
        compiled_generation,
        plain_generation_config,
        prefill_once,
        shared_prefill_on,
    )

    if prompts and isinstance(prompts[0], str):
        prompts = fit_rollout_prompts(model, tokenizer, prompts, max_new_tokens)
    device = next(model.parameters()).device
    k = group_size(prompts)
    if k > 1 and not compiled and shared_prefill_on():
        # a group method's or Quark's k samples of a prompt (k copies side by side) start from one
        # prefill of it, its KV cache repeated k times (farmkit.lm.generation.prefill_once)
        unique = pad_left(prompts[::k], tokenizer.pad_token_id)
        inputs = prefill_once(model, {key: v.to(device) for key, v in unique.items()}, k)
    else:
        inputs = {key: v.to(device) for key, v in pad_left(prompts, tokenizer.pad_token_id).items()}
    batch = {key: inputs[key] for key in ("input_ids", "attention_mask")}
    truncation = Truncation(temperature, top_p, top_k) if truncates(top_p, top_k) else None
    with plain_generation_config(model, tokenizer):
        output = model.generate(
            **inputs,
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            suppress_tokens=list(suppress) or None,
            # after the suppressed tokens' processor, before generate's temperature
            logits_processor=None if truncation is None else [truncation],
            **(compiled_generation() if compiled else {}),
        )
    width = batch["input_ids"].shape[1]
    response_ids = output[:, width:]
    mask, finished = response_mask(response_ids, tokenizer.eos_token_id)
    response_ids = torch.where(
        mask.bool(), response_ids, torch.full_like(response_ids, tokenizer.pad_token_id)
    )
    kept = None
    if truncation is not None:
        kept = torch.stack(truncation.kept, dim=1)[:, : response_ids.shape[1]] * mask.long()
    return Rollout(batch["input_ids"], batch["attention_mask"], response_ids, mask, finished, kept)


def truncates(top_p: float, top_k: int) -> bool:
    return top_p < 1 or top_k > 0


def truncation_mask(logits: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """The tokens top-k then top-p sampling keeps from tempered `logits` [..., vocab] (True: kept),
    by transformers' rule (TopKLogitsWarper, TopPLogitsWarper), which is vLLM's
    (apply_top_k_top_p): the `top_k` largest logits (ties kept), then, of those, the most likely
    tokens whose probabilities add up to more than `top_p` (at least one)."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    if 0 < top_k < logits.shape[-1]:
        keep = logits >= logits.topk(top_k, dim=-1).values[..., -1:]
    if top_p < 1:
        ascending, order = logits.masked_fill(~keep, float("-inf")).sort(dim=-1)
        below = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        below[..., -1] = False
        keep = keep & ~below.scatter(-1, order, below)
    return keep


class Truncation:
    """A logits processor of generate that samples from the top-k/top-p truncation of
    softmax(scores / temperature) (truncation_mask) and records how many tokens it kept at each
    step (`kept`: one [batch] tensor a step)."""

    def __init__(self, temperature: float, top_p: float, top_k: int) -> None:
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.kept: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        keep = truncation_mask(scores.float() / self.temperature, self.top_p, self.top_k)
        self.kept.append(keep.sum(dim=-1))
        return scores.masked_fill(~keep, float("-inf"))


def replayed_logits(logits: torch.Tensor, rollout: Rollout) -> torch.Tensor:
    """The response logits [batch, response, vocab] as the rollout sampled from them: where it was
    sampled with top-k/top-p (rollout.kept), each position's logits outside its `kept` largest
    (and its sampled token, kept always) set to -inf, so log-softmax renormalises over the kept
    set; unchanged otherwise (and on padding, kept 0)."""
    kept = rollout.kept
    if kept is None:
        return logits
    kept = kept.to(logits.device)
    width = int(kept.max().clamp(min=1, max=logits.shape[-1]))
    largest = logits.detach().topk(width, dim=-1).values
    index = (kept.clamp(min=1, max=width) - 1).unsqueeze(-1)
    keep = logits.detach() >= largest.gather(-1, index)
    # the sampled token, should rounding rank it just below the kept count
    keep = keep.scatter(-1, rollout.response_ids.to(logits.device).unsqueeze(-1), True)
    keep = keep | (kept <= 0).unsqueeze(-1)
    return logits.masked_fill(~keep, float("-inf"))


def group_size(prompts: Sequence[Sequence[int]]) -> int:
    """k when `prompts` are runs of k copies of each prompt side by side (how the group methods and
    Quark lay out their k samples of a prompt), else 1."""
    k = 1
    while k < len(prompts) and list(prompts[k]) == list(prompts[0]):
        k += 1
    if k == 1 or len(prompts) % k:
        return 1
    same = all(list(prompts[i]) == list(prompts[i - i % k]) for i in range(len(prompts)))
    return k if same else 1


def add_control_tokens(model: Any, tokenizer: Any, tokens: Sequence[str], like: int) -> list[int]:
    """Register `tokens` as special tokens, grow the embeddings, and start each new input embedding as
    a copy of token `like`'s (the token the control token follows: the end of the prompt). Returns
    their ids.

    A random row, or the mean of all rows (transformers' default), is an input the model has never
    read: behind it SmolLM2-135M answers in fragments (79 -> 23 characters at temperature 0.7) before
    training has had a chance to teach the token anything, and Quark collapses. A copy of the token it
    follows reads as that token repeated. An untied output row starts at the mean of the output rows
    (the average logit: rarely sampled); a tied one is the input row."""
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)  # rows set here, not drawn
    with torch.no_grad():
        inputs = model.get_input_embeddings().weight
        inputs[ids] = inputs[like].clone()
        outputs = model.get_output_embeddings()
        if outputs is not None and outputs.weight.data_ptr() != inputs.data_ptr():
            outputs.weight[ids] = outputs.weight[:old].mean(dim=0)
            if getattr(outputs, "bias", None) is not None:
                outputs.bias[ids] = outputs.bias[:old].mean()
    return ids


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() used them."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def response_logits(
    model: Any, rollout: Rollout, temperature: float, extra_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits (divided by the sampling temperature) that predicted each response token: [batch, response, vocab]."""
    input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
    # only the positions that predict response tokens go through the (vocabulary-wide) output layer
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
        logits_to_keep=rollout.response_ids.shape[1] + 1,
    )
    return out.logits[:, :-1].float() / temperature


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of softmax(logits) at each position (tokens at -inf count 0)."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp.masked_fill(torch.isneginf(logp), 0.0)).sum(-1)


def score_head(model: Any) -> Any:
    """The scalar head of a sequence classifier (applied to every position before pooling)."""
    inner = getattr(model, "module", model)  # DDP
    for name in ("score", "classifier"):
        head = getattr(inner, name, None)
        if head is not None:
            return head
    raise FarmError(
        f"{type(inner).__name__}: no `score` head found; the value model must be a sequence classifier"
    )


def response_values(value_model: Any, rollout: Rollout) -> torch.Tensor:
    """Per-token values from a reward-model-shaped network: its scalar head read at every position
    (the state before each response token), not only at the last token. [batch, response]."""
    captured: list[torch.Tensor] = []
    hook = score_head(value_model).register_forward_hook(
        lambda _module, _inputs, output: captured.append(output)
    )
    try:
        attention_mask = rollout.attention_mask
        value_model(
            input_ids=rollout.input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            use_cache=False,
        )
    finally:
        hook.remove()
    width = rollout.prompt_ids.shape[1]
    return captured[-1][:, width - 1 : -1, 0].float()


class PolicyAndValue(torch.nn.Module):
    """The policy and the value model as one module: DeepSpeed prepares one model per Accelerator, so
    both train under one engine and one optimizer (AlpacaFarm did the same). One forward gives the
    response logits and the per-token values of a rollout."""

    def __init__(self, policy: Any, value: Any) -> None:
        super().__init__()
        self.policy = policy
        self.value = value

    def forward(self, rollout: Rollout, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        return response_logits(self.policy, rollout, temperature), response_values(
            self.value, rollout
        )


class PolicyOnly(torch.nn.Module):
    """The policy alone, shaped like PolicyAndValue (`.policy`, and `.value` None) so that the methods
    without a value model (RLOO, GRPO) share farm-ppo's generation, checkpoint and save code. One
    forward gives the response logits of a rollout."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = policy
        self.value = None

    def forward(self, rollout: Rollout, temperature: float) -> torch.Tensor:
        return response_logits(self.policy, rollout, temperature)


def decode_responses(tokenizer: Any, rollout: Rollout) -> list[str]:
    """Response texts as farm-sample writes them (eos and padding dropped, whitespace stripped)."""
    texts = []
    for ids, mask in zip(
        rollout.response_ids.tolist(), rollout.response_mask.tolist(), strict=True
    ):
        kept = [token for token, keep in zip(ids, mask, strict=True) if keep]
        if kept and kept[-1] == tokenizer.eos_token_id:
            kept = kept[:-1]
        texts.append(tokenizer.decode(kept, skip_special_tokens=True).strip())
    return texts


def add_lora(
    model: Any,
    rank: int,
    alpha: int,
    task_type: str = "CAUSAL_LM",
    adapter: Path | None = None,
    trainable_tokens: Sequence[int] = (),
) -> Any:
    """Wrap a model with LoRA adapters on its attention and MLP projections (peft): fresh ones, or the
    trainable adapters saved in `adapter` (a run being resumed). `trainable_tokens`: rows of the
    embedding that train too (new control tokens, which would otherwise keep their first values)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter is not None:
        return PeftModel.from_pretrained(model, adapter, is_trainable=True)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        task_type=task_type,
        target_modules="all-linear",
        trainable_token_indices=list(trainable_tokens) or None,
    )
    return get_peft_model(model, config)


def plain_model(model: Any) -> Any:
    """The model to save: DDP unwrapped and LoRA adapters merged into the weights."""
    model = getattr(model, "module", model)
    if hasattr(model, "merge_and_unload"):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    return model


def policy_meta(
    tool: str,
    base_model: str,
    template: str,
    seed: int,
    config: dict[str, Any],
    inputs: Sequence[str],
    **extra: Any,
) -> dict[str, Any]:
    """meta.json of a policy folder written by a method (farmkit.lm.modelio's one layout)."""
    from farmkit.lm.modelio import model_meta

    return model_meta(tool, "policy", base_model, template, seed, config, inputs, **extra)


def save_policy(
    model: Any,
    tokenizer: Any,
    folder: str | os.PathLike,
    meta: dict[str, Any],
    extra_files: Sequence[Path] = (),
    extra: Callable[[Path], None] | None = None,
) -> None:
    """Write a loadable policy folder (weights, tokenizer, meta.json) whole or not at all, through
    farmkit.lm.modelio's one writer; `extra_files` are copied in and `extra(folder)` may add more (a
    trainer state to resume from)."""
    from farmkit.lm.modelio import save_model_folder

    save_model_folder(folder, plain_model(model), tokenizer, meta, extra_files, extra)
