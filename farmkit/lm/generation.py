"""Batched sampling with transformers: prompts bucketed by length, left padding, n samples per prompt,
seeded per batch so that a run is reproducible for a given batch layout. Used by farm-sample's `hf`
backend and by every method that samples (best-of-n, expert iteration, Quark). Prompts longer than
the model's context leave room for the new tokens by losing their beginning, with a warning; the
tools that read prompt files decide about such prompts first (farmkit.lm.sampling.screen_long_prompts)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from farmkit.core.io import FarmError
from farmkit.core.seeds import derive_seed
from farmkit.core.values import AT_LEAST_ONE, NON_NEGATIVE, Bounds, Number

log = logging.getLogger("farmkit")
# Characters tokenized per token of room when a prompt may be too long: a window this wide almost
# always holds enough tokens, and a 50 MB prompt is never tokenized whole (the window grows if not).
CHARS_PER_TOKEN_WINDOW = 8
# ... up to this many characters per token of room: a prompt longer than that is over-long without
# being tokenized (no text a model is prompted with averages 64 characters a token), so the time and
# memory a prompt costs are bounded by the context, not by the prompt
MAX_CHARS_PER_TOKEN = 64
# what to do with a prompt the model's context cannot hold beside max_new_tokens
LONG_PROMPTS = ("fail", "skip", "truncate")
# torch.compile's backend for compiled generation. The gpu-check dry run sets "eager" (the graph
# capture without code generation): inductor takes over a minute for a 2-layer model on a CPU.
COMPILE_BACKEND = "inductor"
COMPILE_GENERATION_HELP = (
    "Decode with a static KV cache and the model's forward compiled by torch.compile (mode "
    "reduce-overhead: CUDA graphs on a GPU), with transformers' generate (the hf backend). Each new "
    "batch shape is compiled first (seconds to a minute); on a CPU it compiles too, and rarely pays."
)


@dataclass
class Sample:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finished: bool  # ended with the end-of-sequence token rather than at max_new_tokens


# The decoding settings' kinds and ranges (farmkit.core.values); the shared options and config
# fields of the same names take theirs from here (farmkit.train.config.SHARED_NUMBERS).
DECODING_NUMBERS = {
    "n": Number(int, AT_LEAST_ONE),
    "temperature": Number(float, NON_NEGATIVE),  # 0: greedy decoding
    "top_p": Number(float, Bounds(0, 1, min_open=True)),
    "max_new_tokens": Number(int, AT_LEAST_ONE),
    "batch_size": Number(int, AT_LEAST_ONE),
}


@dataclass
class DecodingConfig:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 300
    batch_size: int = (
        16  # sequences per forward pass (prompts per batch = batch_size // n, at least 1)
    )

    def __post_init__(self) -> None:
        for name, declared in DECODING_NUMBERS.items():
            try:
                setattr(self, name, declared.check(getattr(self, name)))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None

    def as_record_fields(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
        }


def length_buckets(lengths: Sequence[int], prompts_per_batch: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first), so padding stays small."""
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], index))
    return [
        order[start : start + prompts_per_batch]
        for start in range(0, len(order), prompts_per_batch)
    ]


@contextlib.contextmanager
def plain_generation_config(model: Any, tokenizer: Any) -> Iterator[None]:
    """Set the model's own generation_config (repetition_penalty, top_k, no_repeat_ngram_size,
    min_new_tokens, extra end tokens...) aside while sampling, keeping only its special tokens: the
    samples then come from exactly the distribution that `generate`'s arguments say (a method that
    trains on its samples' probabilities needs that). Restored afterwards."""
    from transformers import GenerationConfig

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    own = inner.generation_config
    inner.generation_config = GenerationConfig(
        bos_token_id=own.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    try:
        yield
    finally:
        inner.generation_config = own


def compiled_generation() -> dict[str, Any]:
    """`generate`'s keyword arguments for a static KV cache and a compiled decoding step:
    transformers compiles the forward of the decoding steps (the prefill stays eager) once the cache
    is static, and keeps the cache's length between calls so that a shorter batch does not
    recompile."""
    from transformers import CompileConfig

    mode = {"mode": "reduce-overhead"} if COMPILE_BACKEND == "inductor" else {}
    config = CompileConfig(backend=COMPILE_BACKEND, **mode)
    # transformers compiles only on CUDA and a few accelerators unless told otherwise: on the CPU
    # the option would otherwise decode uncompiled without a word
    config._compile_all_devices = True
    return {"cache_implementation": "static", "compile_config": config}


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    config: DecodingConfig,
    seed: int = 0,
    on_batch: Callable[[list[int], list[list[Sample]]], None] | None = None,
    skip: Collection[int] = (),
    shard: tuple[int, int] = (0, 1),
    compiled: bool = False,
) -> list[list[Sample]]:
    """Return config.n samples for each prompt, in prompt order.

    `on_batch(indices, samples)` is called after each batch (for progress, streaming and resume).
    Batch b is seeded with derive_seed(seed, "generation batch", b), so results depend on the seed
    and the batch layout only.
    `skip` holds indices of prompts already done (a resumed run): a batch made only of them is not
    generated (its samples stay empty), and the other batches keep their numbers, hence their seeds.
    `shard` = (rank, processes): this process generates the batches whose number is rank modulo
    processes, so several processes together draw exactly the samples one process draws.
    `compiled`: a static KV cache and a compiled decoding step (compiled_generation).
    """
    import torch

    encoded = fit_prompts(tokenizer, prompts, prompt_room(model, tokenizer, config.max_new_tokens))
    prompts_per_batch = max(1, config.batch_size // config.n)
    results: list[list[Sample]] = [[] for _ in prompts]
    device = next(model.parameters()).device
    sampling = config.temperature > 0
    done = set(skip)
    for batch_number, indices in enumerate(
        length_buckets([len(ids) for ids in encoded], prompts_per_batch)
    ):
        if batch_number % shard[1] != shard[0] or done.issuperset(indices):
            continue
        batch = tokenizer.pad(
            {"input_ids": [encoded[i] for i in indices]}, padding=True, return_tensors="pt"
        )
        batch = {key: value.to(device) for key, value in batch.items()}
        torch.manual_seed(derive_seed(seed, "generation batch", batch_number))
        kwargs: dict[str, Any] = {
            "max_new_tokens": config.max_new_tokens,
            "num_return_sequences": config.n,
            "pad_token_id": tokenizer.pad_token_id,
            "do_sample": sampling,
        }
        if config.n > 1 and not compiled and shared_prefill_on():
            # the n samples of a prompt start from one prefill of it (its KV cache repeated n times)
            # rather than from n identical prefills
            batch = prefill_once(model, batch, config.n)
            kwargs["num_return_sequences"] = 1
        if sampling:
            kwargs.update(temperature=config.temperature, top_p=config.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if compiled:
            kwargs.update(compiled_generation())
        with torch.no_grad():
            output = model.generate(**batch, **kwargs)
        prompt_width = batch["input_ids"].shape[1]
        completions = output[:, prompt_width:]
        # one row per prompt (a shared prefill's batch holds each prompt n times, in order)
        rows_per_prompt = config.n // kwargs["num_return_sequences"]
        prompt_lengths = batch["attention_mask"][::rows_per_prompt].sum(dim=1).tolist()
        batch_samples: list[list[Sample]] = []
        for row, index in enumerate(indices):
            samples = []
            for k in range(config.n):
                tokens = completions[row * config.n + k].tolist()
                finished = tokenizer.eos_token_id in tokens
                if finished:
                    tokens = tokens[: tokens.index(tokenizer.eos_token_id)]
                while tokens and tokens[-1] == tokenizer.pad_token_id:
                    tokens.pop()
                text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
                samples.append(Sample(text, int(prompt_lengths[row]), len(tokens), finished))
            results[index] = samples
            batch_samples.append(samples)
        if on_batch is not None:
            on_batch(list(indices), batch_samples)
    return results


def shared_prefill_on() -> bool:
    """Whether a prompt's n samples share one prefill (the default); FARMKIT_SHARED_PREFILL=0 gives
    each sample its own, as transformers' num_return_sequences does (bench/bench_prefill.py compares
    the two)."""
    return os.environ.get("FARMKIT_SHARED_PREFILL", "1") != "0"


def prefill_once(model: Any, batch: dict[str, Any], n: int) -> dict[str, Any]:
    """`generate`'s inputs for n samples of each prompt in `batch` (padded on the left) that start
    from one prefill per prompt: every prompt token but the last goes through the model once, its
    KV cache is repeated n times (each prompt's copies side by side, as num_return_sequences lays
    them out) and `generate` goes on from there with the last token. The samples' distribution is
    the same as from n prefills; the same seed draws the same random numbers, so they differ from
    n prefills' only where floating-point rounding (a batch of B rows against n x B) moves a draw
    across a boundary."""
    import torch

    ids, mask = batch["input_ids"], batch["attention_mask"]
    if ids.shape[1] < 2:  # nothing to prefill before the last token
        return {key: value.repeat_interleave(n, dim=0) for key, value in batch.items()}
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as generate counts them
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    accepted = inspect.signature(inner.forward).parameters
    # transformers 5 calls the cache `cache` (past_key_values before)
    cache_name = "cache" if "cache" in accepted else "past_key_values"
    # no vocabulary-wide output but for one position, where the model can be told so
    keep = {"logits_to_keep": 1} if "logits_to_keep" in accepted else {}
    with torch.no_grad():
        out = model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
            **keep,
        )
    cache = getattr(out, cache_name, None)
    if cache is None:
        cache = out.past_key_values
    cache.batch_repeat_interleave(n)
    return {
        "input_ids": ids.repeat_interleave(n, dim=0),
        "attention_mask": mask.repeat_interleave(n, dim=0),
        cache_name: cache,
    }


def prompt_room(model: Any, tokenizer: Any, max_new_tokens: int) -> int | None:
    """How many prompt tokens fit in the model's context beside max_new_tokens (None: no known limit)."""
    return config_room(model.config, tokenizer, max_new_tokens)


def config_room(config: Any, tokenizer: Any, max_new_tokens: int) -> int | None:
    """`prompt_room` from the model's configuration, before its weights are loaded."""
    limits = [
        getattr(config, "max_position_embeddings", None),
        getattr(tokenizer, "model_max_length", None),
    ]
    known = [int(limit) for limit in limits if isinstance(limit, int) and 0 < limit < 10**7]
    if not known:
        return None
    return context_room(min(known), max_new_tokens)


def context_room(context: int, max_new_tokens: int) -> int:
    """How many prompt tokens fit in a context of `context` tokens beside max_new_tokens."""
    if max_new_tokens >= context:
        raise FarmError(
            f"max_new_tokens is {max_new_tokens}, but the model's context holds {context} tokens "
            "in all: leave room for the prompt"
        )
    return context - max_new_tokens


def fit_prompts(
    tokenizer: Any,
    prompts: Sequence[str],
    room: int | None,
    numbers: Sequence[int] | None = None,
    total: int | None = None,
) -> list[list[int]]:
    """Token ids of each prompt, left-truncated to `room` tokens (the end of a prompt, where the
    instruction ends and the answer starts, is what generation needs). Long prompts are cut to a
    window of characters before tokenizing, so memory stays bounded by the context, not the prompt.
    Warnings name prompt `numbers[i]` of `total` (default: i + 1 of len(prompts))."""
    if room is None:
        return tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    fitted = []
    for index, (ids, over) in enumerate(_tails(tokenizer, prompts, room)):
        if over:
            log.warning(
                "prompt %d of %d is longer than the model's context allows (%d tokens beside max_new_tokens; "
                "it has %s characters): keeping its last %d tokens",
                numbers[index] if numbers is not None else index + 1,
                total if total is not None else len(prompts),
                room,
                f"{len(prompts[index]):,}",
                room,
            )
        fitted.append(ids)
    return fitted


def over_long(tokenizer: Any, prompts: Sequence[str], room: int | None) -> list[bool]:
    """Which prompts the context cannot hold whole: more than `room` tokens (or, beyond
    MAX_CHARS_PER_TOKEN characters a token of room, too long to be worth tokenizing)."""
    if room is None:
        return [False] * len(prompts)
    return [over for _, over in _tails(tokenizer, prompts, room)]


def _tails(tokenizer: Any, prompts: Sequence[str], room: int) -> list[tuple[list[int], bool]]:
    """(the last `room` token ids of each prompt, whether it had more), tokenizing a window of its
    last characters that widens while it holds too few tokens, up to MAX_CHARS_PER_TOKEN a token."""
    window, bound = room * CHARS_PER_TOKEN_WINDOW, room * MAX_CHARS_PER_TOKEN
    encoded = tokenizer([prompt[-window:] for prompt in prompts], add_special_tokens=False)[
        "input_ids"
    ]
    tails = []
    for prompt, ids in zip(prompts, encoded, strict=True):
        wide = window
        while len(ids) <= room and len(prompt) > wide and wide < bound:
            wide = min(wide * 4, bound)
            ids = tokenizer(prompt[-wide:], add_special_tokens=False)["input_ids"]
        tails.append((ids[-room:], len(ids) > room or len(prompt) > wide))
    return tails
