"""farm-sample's engine: n outputs per instruction from one of three backends (transformers `hf`,
`vllm`, or an OpenAI-compatible endpoint), written in input order with n samples per prompt
consecutive, and resumable: finished prompts go to a side file that a later `--resume` reads.

Every backend reports finished prompts through one callback, `on_done(indices, samples)`; the
`OrderedOutput` keeps them, writes the side file, and emits records in prompt order.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from farmkit.generation import DecodingConfig, Sample
from farmkit.io import FarmError, RecordWriter

log = logging.getLogger("farmkit")
BACKENDS = ("auto", "hf", "vllm", "openai")
OnDone = Callable[[list[int], list[list[Sample]]], None]


def vllm_usable() -> bool:
    """vLLM is installed and a CUDA GPU is present (vLLM's default build is GPU-only)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def default_backend(device: str = "auto") -> str:
    return "vllm" if device in ("auto", "cuda") and vllm_usable() else "hf"


def generator_name(model: str) -> str:
    """A model's name in records: meta.json's "name", else the folder's base name, else the argument."""
    from farmkit.models import EMBEDDED, read_meta, resolve

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
    digest = hashlib.sha256(f"{seed}:{index}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass
class SampleSettings:
    model: str
    backend: str = "hf"
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    seed: int = 0
    template: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    concurrency: int = 8  # openai: requests in flight


# ---------------------------------------------------------------------------------------------
# Backends: each turns instruction records into samples and calls on_done as prompts finish


def sample_hf(
    records: Sequence[dict], settings: SampleSettings, on_done: OnDone, skip: set[int], on_ready: Callable[[], None]
) -> None:
    from farmkit.generation import generate
    from farmkit.models import PromptFormat, load_causal_lm, resolve

    path = resolve(settings.model)
    model, tokenizer = load_causal_lm(path, device=settings.device, dtype=settings.dtype)
    prompt_format = PromptFormat.for_model(path, settings.template)
    prompts = [prompt_format.prompt(tokenizer, r["instruction"], r.get("input") or "") for r in records]
    on_ready()
    generate(model, tokenizer, prompts, settings.decoding, seed=settings.seed, on_batch=on_done, skip=skip)


def sample_vllm(
    records: Sequence[dict], settings: SampleSettings, on_done: OnDone, skip: set[int], on_ready: Callable[[], None]
) -> None:
    if not vllm_usable():
        raise FarmError("the vllm backend needs vLLM installed (pip install 'farmkit[gpu]') and a CUDA GPU")
    from vllm import LLM, SamplingParams

    from farmkit.models import PromptFormat, load_tokenizer, resolve

    path = resolve(settings.model)
    tokenizer = load_tokenizer(path)
    prompt_format = PromptFormat.for_model(path, settings.template)
    engine = LLM(model=path, tokenizer=path, dtype=settings.dtype, seed=settings.seed)
    on_ready()
    decoding = settings.decoding
    todo = [index for index in range(len(records)) if index not in skip]
    # chunks keep the side file and the progress bar moving; vLLM schedules within a chunk
    chunk = max(64, decoding.batch_size * 8)
    for start in range(0, len(todo), chunk):
        indices = todo[start : start + chunk]
        prompts = [
            {"prompt_token_ids": tokenizer(
                prompt_format.prompt(tokenizer, records[i]["instruction"], records[i].get("input") or ""),
                add_special_tokens=False)["input_ids"]}
            for i in indices
        ]
        params = [
            SamplingParams(n=decoding.n, temperature=decoding.temperature, top_p=decoding.top_p,
                           max_tokens=decoding.max_new_tokens, seed=request_seed(settings.seed, i))
            for i in indices
        ]
        outputs = engine.generate(prompts, params, use_tqdm=False)
        samples = [
            [Sample(o.text.strip(), len(out.prompt_token_ids), len(o.token_ids), o.finish_reason == "stop") for o in out.outputs]
            for out in outputs
        ]
        on_done(indices, samples)


def openai_client_settings() -> tuple[str | None, str]:
    """(base URL, API key) from OPENAI_BASE_URL and OPENAI_API_KEY; a local endpoint needs no key."""
    base_url = os.environ.get("OPENAI_BASE_URL") or None
    api_key = os.environ.get("OPENAI_API_KEY")
    if not api_key:
        if base_url is None:
            raise FarmError("the openai backend needs OPENAI_API_KEY (and OPENAI_BASE_URL for another endpoint)")
        api_key = "unused"  # OpenAI-compatible local servers accept any key
    return base_url, api_key


def sample_openai(
    records: Sequence[dict], settings: SampleSettings, on_done: OnDone, skip: set[int], on_ready: Callable[[], None]
) -> None:
    """Chat completions with the chat template's user turn (the server applies the model's template),
    or, with --template alpaca, text completions of farmkit's own Alpaca prompt. One request per
    sample, each with its own seed, at most `concurrency` in flight; the client retries rate limits
    and server errors with backoff (honouring Retry-After) and fails at once on the rest."""
    on_ready()
    asyncio.run(_sample_openai(records, settings, on_done, skip))


async def _sample_openai(records: Sequence[dict], settings: SampleSettings, on_done: OnDone, skip: set[int]) -> None:
    import openai

    from farmkit.models import chat_content, format_prompt

    base_url, api_key = openai_client_settings()
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=6, timeout=300)
    decoding = settings.decoding
    limit = asyncio.Semaphore(max(1, settings.concurrency))
    use_chat = settings.template in ("auto", "chat")

    async def one(index: int, sample_index: int) -> Sample:
        record = records[index]
        common = {"model": settings.model, "temperature": decoding.temperature, "top_p": decoding.top_p,
                  "max_tokens": decoding.max_new_tokens, "seed": request_seed(settings.seed, index, sample_index)}
        async with limit:
            if use_chat:
                content = chat_content(record["instruction"], record.get("input") or "")
                response = await client.chat.completions.create(messages=[{"role": "user", "content": content}], **common)
                choice = response.choices[0]
                text = choice.message.content or ""
            else:
                prompt = format_prompt(None, record["instruction"], record.get("input") or "", "alpaca")
                response = await client.completions.create(prompt=prompt, **common)
                choice = response.choices[0]
                text = choice.text or ""
        usage = response.usage
        return Sample(text.strip(), usage.prompt_tokens if usage else 0, usage.completion_tokens if usage else 0,
                      choice.finish_reason == "stop")

    async def prompt_done(index: int) -> tuple[int, list[Sample]]:
        return index, list(await asyncio.gather(*(one(index, k) for k in range(decoding.n))))

    pending = [asyncio.ensure_future(prompt_done(i)) for i in range(len(records)) if i not in skip]
    try:
        for finished in asyncio.as_completed(pending):
            index, samples = await finished
            on_done([index], [samples])
    except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError, openai.BadRequestError) as exc:
        raise FarmError(f"the endpoint refused the request ({type(exc).__name__}, status {exc.status_code}): {_api_message(exc)}") from None
    except openai.APIError as exc:
        raise FarmError(f"the endpoint failed after retries ({type(exc).__name__}): {_api_message(exc)}") from None
    finally:
        for task in pending:
            task.cancel()
        await client.close()


def _api_message(exc: Exception) -> str:
    """The endpoint's error message, with anything that looks like an API key blanked out
    (OpenAI's own 401 message quotes part of the key)."""
    body = getattr(exc, "body", None)
    message = str(getattr(exc, "message", exc))
    if isinstance(body, dict):
        detail = body.get("error", body)
        if isinstance(detail, dict) and detail.get("message"):
            message = str(detail["message"])
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        message = message.replace(key, "***")
    return re.sub(r"\bsk-[\w*-]+", "sk-***", message)[:300]


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
                log.info("farm-sample: %s exists; starting over (use --resume to continue it)", self.side_path)
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
            log.warning("farm-sample: nothing to resume (%s not found); starting from the beginning", self.side_path)
            return {}
        lines = self.side_path.read_bytes().split(b"\n")
        try:
            header = orjson.loads(lines[0])
        except orjson.JSONDecodeError:
            header = None
        if header != self.fingerprint:
            raise FarmError(f"{self.side_path} was written by a run with other prompts or settings; "
                            "rerun without --resume to start over")
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
            self.side.write(orjson.dumps([[i, r] for i, r in zip(indices, records, strict=True)]) + b"\n")
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
    from farmkit.cli import progress

    out = OrderedOutput(output, fingerprint or {}, resume, len(records))
    bar = progress(total=len(records), unit="prompt", desc="farm-sample", initial=len(out.done))
    started, tokens = time.time(), 0

    def on_done(indices: list[int], samples: list[list[Sample]]) -> None:
        nonlocal tokens
        tokens += sum(s.completion_tokens for group in samples for s in group)
        out.add(indices, [make_records(records[i], group) for i, group in zip(indices, samples, strict=True)])
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
