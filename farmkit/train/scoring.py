"""A reward model read and scored: the text it reads (the formatted prompt, the response and its end
token), its scalar head read at each sequence's last real token, and RewardScorer, which scores
(instruction, input, output) triples in batches. Shared by reward-model training (farmkit.methods.reward),
farm-score, best-of-n, the RL methods, the gold evaluation and the reward-model oracle judge."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from farmkit.core.io import FarmError
from farmkit.lm.models import PromptFormat, read_meta, resolve, response_end


def reward_text(
    tokenizer: Any,
    prompt_format: PromptFormat,
    instruction: str,
    input: str | None,
    output: str,
    finished: bool = True,
    messages: list[dict[str, str]] | None = None,
) -> str:
    """What a reward model reads: the formatted prompt (the whole conversation for a multi-turn one),
    the response, and end-of-sequence unless the response was cut off before it (the model can then
    tell the two apart)."""
    return (
        prompt_format.prompt(tokenizer, instruction, input, messages=messages)
        + output
        + (response_end(tokenizer) if finished else "")
    )


def reward_format(
    model_path: str | os.PathLike, tokenizer: Any, template: str | None = None
) -> PromptFormat:
    """The prompt format of a model folder with `auto` resolved and no control token (a reward model
    judges responses, it is never sampled from)."""
    return PromptFormat(template=PromptFormat.for_model(model_path, template).resolved(tokenizer))


def tail_token_ids(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of each text, its last `max_length` kept: the response and its end token sit at the
    end, so truncation removes the start of long prompts. A long text is tokenized through a window
    of characters (as generation does), never whole."""
    from farmkit.lm.generation import CHARS_PER_TOKEN_WINDOW

    if not texts:
        return []
    window = max_length * CHARS_PER_TOKEN_WINDOW
    encoded = tokenizer([text[-window:] for text in texts], add_special_tokens=False)["input_ids"]
    for index, text in enumerate(texts):
        ids, wide = encoded[index], window
        while len(ids) <= max_length and len(text) > wide:  # too few tokens in the window: widen it
            wide *= 4
            ids = tokenizer(text[-wide:], add_special_tokens=False)["input_ids"]
        encoded[index] = ids[-max_length:]
    return encoded


def last_token_index(attention_mask: Any) -> Any:
    """Position of each row's last real token (a trailing end-of-sequence token included), read from
    the attention mask, so it holds for left and right padding alike."""
    import torch

    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (positions * attention_mask.long()).argmax(dim=1)


def _score_head(network: Any) -> Any:
    inner = getattr(network, "module", network)  # DDP, DeepSpeed; peft forwards the attribute
    head = getattr(inner, "score", None)
    if head is None:
        raise FarmError(
            f"{type(inner).__name__}: no `score` head; a reward model must be a sequence classifier with one label"
        )
    return head


def sequence_rewards(network: Any, input_ids: Any, attention_mask: Any) -> Any:
    """Rewards (a 1-d tensor) of padded token sequences: the scalar head read at each row's last real
    token. The model's own pooling takes the last token that differs from the pad id, which skips an
    end-of-sequence token that shares it (SmolLM2, or any model whose pad farmkit sets to eos): a
    finished and a cut-off response would then score alike."""
    import torch

    captured: list[Any] = []
    hook = _score_head(network).register_forward_hook(
        lambda _module, _inputs, output: captured.append(output)
    )
    try:
        # positions skip left padding, so a row scores the same whichever side it is padded on
        positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        network(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=False,
        )
    finally:
        hook.remove()
    per_position = captured[-1][..., 0]
    rows = torch.arange(per_position.shape[0], device=per_position.device)
    return per_position[rows, last_token_index(attention_mask).to(per_position.device)]


def _forward(network: Any, tokenizer: Any, sequences: Sequence[list[int]], device: Any) -> Any:
    batch = tokenizer.pad({"input_ids": list(sequences)}, padding=True, return_tensors="pt")
    return sequence_rewards(
        network, batch["input_ids"].to(device), batch["attention_mask"].to(device)
    )


class RewardScorer:
    """A loaded reward model that scores (instruction, input, output) triples in batches."""

    def __init__(
        self,
        model: str | os.PathLike,
        device: str = "auto",
        batch_size: int = 16,
        offload: bool = False,
    ):
        """`offload`: keep the weights in CPU memory and stream each layer to `device` as it runs
        (launch.offload_frozen), in the precision `device` would load them in."""
        import torch

        from farmkit.lm.models import choose_device, choose_dtype, load_reward_model
        from farmkit.lm.sampling import generator_name

        self.name = generator_name(str(model))
        self.path = resolve(model)
        self.device = choose_device(device)
        self.offloaded = offload
        if offload:
            from farmkit.train.launch import offload_frozen

            dtype = "bfloat16" if choose_dtype(self.device) == torch.bfloat16 else "float32"
            self.network, self.tokenizer = load_reward_model(self.path, device="cpu", dtype=dtype)
            offload_frozen(self.network, self.device)
        else:
            self.network, self.tokenizer = load_reward_model(self.path, device=device)
        self.network.eval()
        self.format = reward_format(self.path, self.tokenizer)
        self.max_length = int(read_meta(self.path).get("config", {}).get("max_length") or 1024)
        self.batch_size = batch_size

    def score(
        self,
        items: Sequence[tuple[str, str | None, str]],
        progress: Any = None,
        finished: Sequence[bool] | None = None,
    ) -> list[float]:
        """Rewards in the order of `items`; batches group texts of similar length. `finished[i]` False
        marks a response cut off before its end token: it is scored without one."""
        import torch

        ends = [True] * len(items) if finished is None else list(finished)
        if len(ends) != len(items):
            raise ValueError(f"{len(items)} items but {len(ends)} finished flags")
        texts = [
            reward_text(self.tokenizer, self.format, instruction, input, output, end)
            for (instruction, input, output), end in zip(items, ends, strict=True)
        ]
        encoded = tail_token_ids(self.tokenizer, texts, self.max_length)
        order = sorted(range(len(encoded)), key=lambda index: -len(encoded[index]))
        rewards = [0.0] * len(encoded)
        # offloaded weights are placeholders until a layer runs: the inputs go to where it runs
        device = self.device if self.offloaded else next(self.network.parameters()).device
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                indices = order[start : start + self.batch_size]
                values = _forward(
                    self.network, self.tokenizer, [encoded[i] for i in indices], device
                )
                for index, value in zip(indices, values.float().tolist(), strict=True):
                    rewards[index] = value
                if progress is not None:
                    progress.update(len(indices))
        return rewards
