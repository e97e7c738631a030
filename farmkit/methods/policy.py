"""Model-side pieces that the policy-optimization methods (PPO, Quark, DPO) share: sampling rollouts
as token ids, log-probabilities and per-token values of given responses, LoRA wrapping, and writing a
policy folder with its meta.json. Reward-model scores come from farmkit.methods.reward.RewardScorer,
the same code farm-score runs."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from farmkit.io import FarmError, atomic_path
from farmkit.methods.rl_common import response_mask
from farmkit.models import file_sha256, package_versions, write_meta


@dataclass
class Rollout:
    """Prompts and sampled responses as padded token ids (prompts padded on the left)."""

    prompt_ids: torch.Tensor  # [batch, prompt width]
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor  # [batch, response width]; after the end: padding
    response_mask: torch.Tensor  # float 0/1, the eos token included
    finished: torch.Tensor  # bool: the response ended with eos before the length limit

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask.to(self.prompt_mask.dtype)], dim=1)

    def rows(self, index: Any) -> Rollout:
        return Rollout(*(getattr(self, field.name)[index] for field in dataclasses.fields(self)))

    def to(self, device: Any) -> Rollout:
        return Rollout(*(getattr(self, field.name).to(device) for field in dataclasses.fields(self)))


def rollout_from_lists(prompts: Sequence[list[int]], responses: Sequence[list[int]], pad_token_id: int, device: Any = "cpu") -> Rollout:
    """Pad token-id lists into a Rollout: prompts on the left, responses (eos included) on the right."""
    prompt_width = max(len(ids) for ids in prompts)
    response_width = max(1, max(len(ids) for ids in responses))
    prompt_ids = torch.tensor([[pad_token_id] * (prompt_width - len(ids)) + ids for ids in prompts])
    prompt_mask = torch.tensor([[0] * (prompt_width - len(ids)) + [1] * len(ids) for ids in prompts])
    response_ids = torch.tensor([ids + [pad_token_id] * (response_width - len(ids)) for ids in responses])
    mask = torch.tensor([[1.0] * len(ids) + [0.0] * (response_width - len(ids)) for ids in responses])
    finished = torch.ones(len(responses), dtype=torch.bool)
    return Rollout(prompt_ids, prompt_mask, response_ids, mask, finished).to(device)


def disable_dropout(model: Any) -> None:
    """Rollout and update must see the same function of the weights: no dropout anywhere."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


@torch.no_grad()
def sample_rollout(model: Any, tokenizer: Any, prompts: Sequence[str], temperature: float, max_new_tokens: int) -> Rollout:
    """Sample one response per prompt (seed torch beforehand); tokens after the first eos are padding."""
    batch = tokenizer(list(prompts), add_special_tokens=False, padding=True, return_tensors="pt")
    device = next(model.parameters()).device
    batch = {key: value.to(device) for key, value in batch.items()}
    output = model.generate(
        **batch,
        do_sample=True,
        temperature=temperature,
        top_p=1.0,
        top_k=0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    width = batch["input_ids"].shape[1]
    response_ids = output[:, width:]
    mask, finished = response_mask(response_ids, tokenizer.eos_token_id)
    response_ids = torch.where(mask.bool(), response_ids, torch.full_like(response_ids, tokenizer.pad_token_id))
    return Rollout(batch["input_ids"], batch["attention_mask"], response_ids, mask, finished)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() used them."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def response_logits(model: Any, rollout: Rollout, temperature: float, extra_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (divided by the sampling temperature) that predicted each response token: [batch, response, vocab]."""
    input_ids, attention_mask = rollout.input_ids, rollout.attention_mask
    # only the positions that predict response tokens go through the (vocabulary-wide) output layer
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                use_cache=False, logits_to_keep=rollout.response_ids.shape[1] + 1)
    return out.logits[:, :-1].float() / temperature


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def score_head(model: Any) -> Any:
    """The scalar head of a sequence classifier (applied to every position before pooling)."""
    inner = getattr(model, "module", model)  # DDP
    for name in ("score", "classifier"):
        head = getattr(inner, name, None)
        if head is not None:
            return head
    raise FarmError(f"{type(inner).__name__}: no `score` head found; the value model must be a sequence classifier")


def response_values(value_model: Any, rollout: Rollout) -> torch.Tensor:
    """Per-token values from a reward-model-shaped network: its scalar head read at every position
    (the state before each response token), not only at the last token. [batch, response]."""
    captured: list[torch.Tensor] = []
    hook = score_head(value_model).register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    try:
        attention_mask = rollout.attention_mask
        value_model(input_ids=rollout.input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask), use_cache=False)
    finally:
        hook.remove()
    width = rollout.prompt_ids.shape[1]
    return captured[-1][:, width - 1 : -1, 0].float()


def decode_responses(tokenizer: Any, rollout: Rollout) -> list[str]:
    """Response texts as farm-sample writes them (eos and padding dropped, whitespace stripped)."""
    texts = []
    for ids, mask in zip(rollout.response_ids.tolist(), rollout.response_mask.tolist(), strict=True):
        kept = [token for token, keep in zip(ids, mask, strict=True) if keep]
        if kept and kept[-1] == tokenizer.eos_token_id:
            kept = kept[:-1]
        texts.append(tokenizer.decode(kept, skip_special_tokens=True).strip())
    return texts


def add_lora(model: Any, rank: int, alpha: int, task_type: str = "CAUSAL_LM") -> Any:
    """Wrap a model with LoRA adapters on its attention and MLP projections (peft)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, task_type=task_type, target_modules="all-linear"
    )
    return get_peft_model(model, config)


def plain_model(model: Any) -> Any:
    """The model to save: DDP unwrapped and LoRA adapters merged into the weights."""
    model = getattr(model, "module", model)
    if hasattr(model, "merge_and_unload"):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    return model


def policy_meta(tool: str, base_model: str, template: str, seed: int, config: dict[str, Any],
                inputs: Sequence[str], **extra: Any) -> dict[str, Any]:
    """meta.json of a policy folder written by a method (see COMMON.md's keys)."""
    meta = {
        "tool": tool,
        "kind": "policy",
        "base_model": str(Path(base_model).resolve()) if Path(base_model).is_dir() else base_model,
        "prompt_template": template,
        "seed": seed,
        "config": config,
        "inputs": {str(path): file_sha256(path) for path in inputs},
        "versions": package_versions(),
    }
    meta.update({key: value for key, value in extra.items() if value is not None})
    return meta


def save_policy(
    model: Any, tokenizer: Any, folder: str | os.PathLike, meta: dict[str, Any],
    extra_files: Sequence[Path] = (), extra: Callable[[Path], None] | None = None,
) -> None:
    """Write a loadable policy folder (weights, tokenizer, meta.json) whole or not at all;
    `extra_files` are copied in and `extra(folder)` may add more (a trainer state to resume from)."""
    with atomic_path(folder) as tmp:
        tmp.unlink()
        plain_model(model).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for path in extra_files:
            if Path(path).exists():
                shutil.copy(path, tmp / Path(path).name)
        if extra is not None:
            extra(tmp)
        write_meta(tmp, meta)
