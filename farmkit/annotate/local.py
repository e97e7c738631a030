"""The `local` backend: a judge model run in-process with transformers (the embedded model by default).

The judge reads a `choice` template, formatted as a user turn with the model's own prompt format,
followed by the template's `[answer]` text (the start of its reply). The verdict comes from the
log-probabilities of the next token being " A" or " B": no generation and no parsing.
Answers longer than MAX_ANSWER_CHARS are cut (marked " [...]") so that two of them fit the small
model's context.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from farmkit.annotate.base import Backend, Verdict, decide
from farmkit.annotate.pools import Judge, Pool
from farmkit.annotate.prompts import Shown, load_template
from farmkit.core.io import FarmError

MAX_ANSWER_CHARS = 2500  # about 600 tokens: two answers and the question fit a 2,048-token context


class LocalBackend(Backend):
    name = "local"
    cacheable = True

    def __init__(self, pool: Pool, options: dict[str, Any]) -> None:
        super().__init__(pool, options)
        self.device = options.get("device", "auto")
        self._loaded: dict[tuple[str, str], Any] = {}
        self._lock = asyncio.Lock()  # one forward pass at a time: the model uses every core already

    @classmethod
    def identity(cls, pool: Pool, judge: Judge, options: dict[str, Any]) -> dict[str, Any]:
        """The model's folder and weight files, the prompt's text, the device and dtype it runs in."""
        from pathlib import Path

        from farmkit.lm.models import choose_device, choose_dtype, resolve

        folder = Path(resolve(judge.model or "embedded"))
        weights = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
        stamps = [(w.name, w.stat().st_size, w.stat().st_mtime_ns) for w in weights]
        device = choose_device(options.get("device", "auto"))
        return {
            "model": str(folder),
            "weights": stamps,
            "template": load_template(judge.prompt).text,
            "device": device.split(":")[0],
            "dtype": str(choose_dtype(device, judge.dtype)),
        }

    def model_name(self, judge: Judge) -> str:
        return judge.model or "embedded"

    def _load(self, model: str, dtype: str) -> Any:
        if (model, dtype) not in self._loaded:
            from farmkit.lm.models import PromptFormat, load_causal_lm, resolve

            network, tokenizer = load_causal_lm(model, device=self.device, dtype=dtype)
            network.eval()
            choices = []
            for letter in (" A", " B"):
                ids = tokenizer.encode(letter, add_special_tokens=False)
                if len(ids) != 1:
                    raise FarmError(
                        f"{model}: {letter!r} is not one token for this tokenizer; the local judge needs it to be"
                    )
                choices.append(ids[0])
            self._loaded[model, dtype] = (
                network,
                tokenizer,
                PromptFormat.for_model(resolve(model)),
                choices,
            )
        return self._loaded[model, dtype]

    async def judge(
        self,
        judge: Judge,
        pairs: list[Shown],
        draws: list[float],
        seed: int,
        reservation: Any = None,  # unpriced: no budget to hold
    ) -> list[Verdict]:
        async with self._lock:
            return await asyncio.to_thread(self._judge, judge, pairs, draws)

    def _judge(self, judge: Judge, pairs: list[Shown], draws: list[float]) -> list[Verdict]:
        import torch

        started = time.perf_counter()
        network, tokenizer, prompt_format, (token_a, token_b) = self._load(
            self.model_name(judge), judge.dtype
        )
        template = load_template(judge.prompt)
        if template.format != "choice":
            raise FarmError(
                f"judge {judge.name}: the local backend needs a `choice` template, not {template.format}"
            )
        texts = []
        for pair in pairs:
            pair = Shown(pair.instruction, pair.input, _cut(pair.output_a), _cut(pair.output_b))
            question = template.messages([pair])[-1]["content"]
            texts.append(prompt_format.prompt(tokenizer, question, "") + template.answer_prefix)
        batch = tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt").to(
            network.device
        )
        with torch.no_grad():
            logits = (
                network(**batch).logits[:, -1, :].float()
            )  # left padding: the last position is the next token
        log_probs = torch.log_softmax(logits, dim=-1)
        elapsed = (time.perf_counter() - started) / len(pairs)
        verdicts = []
        for row, draw in enumerate(draws):
            lp_a, lp_b = log_probs[row, token_a].item(), log_probs[row, token_b].item()
            scale = judge.temperature if judge.temperature > 0 else 1.0
            probability = 1.0 / (1.0 + math.exp((lp_b - lp_a) / scale))
            verdicts.append(
                Verdict(
                    decide(probability, judge.temperature, draw),
                    model=self.model_name(judge),
                    probability=round(probability, 6),
                    prompt_tokens=int(batch["attention_mask"][row].sum()),
                    seconds=round(elapsed, 4),
                    raw=f"logp(A)={lp_a:.4f} logp(B)={lp_b:.4f}",
                )
            )
        return verdicts

    async def close(self) -> None:
        self._loaded.clear()


def _cut(answer: str) -> str:
    return answer if len(answer) <= MAX_ANSWER_CHARS else answer[:MAX_ANSWER_CHARS] + " [...]"
