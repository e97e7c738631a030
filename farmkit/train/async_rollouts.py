"""--async-rollouts: one-step (at most --max-staleness steps) off-policy rollouts for the on-policy
trainer (farmkit.train.onpolicy). The batch of a later step is sampled while the current one
trains, by a copy of the policy's weights as they were when that sampling was asked for.

The schedule is fixed by the step numbers, never by timing, so a run is the same however fast
either side goes: the batch of step m (0-based) is sampled by the weights after max(first, m - K)
steps (K = --max-staleness; `first`: the step the run started or resumed at), and its staleness,
m minus that, goes to its metrics row. At the start of step n the batches of steps n .. n + K not
yet asked for are asked for, from a copy of the weights now (after n steps); then step n's is
awaited. K = 0 waits for the batch just asked for: the synchronous run, sampled by a copy.

One thread samples (hf backend: transformers' generate on the copy; torch releases the GIL in its
kernels, so it overlaps the update on the CPU's other cores, or the GPU's idle time). A copy is
made once and refilled (load_state_dict) when no batch in flight still samples from it: with
K = 1 one copy beside the policy. Where the batch is stale the copy also gives its
log-probabilities of the sampled tokens (the behaviour policy's, in the rollout's
`engine_logprobs`), and the trainer's rollout correction weights each token by
min(pi_trainer / pi_behaviour, cap): the importance ratio between the weights the update starts
from and those that sampled (farmkit.train.rollout_backends.rollout_correction).

With the vllm backend the colocated engine is the copy (`push`: the trainer hands it the policy's
weights, farmkit.train.rollout_backends.VLLMBackend.sync): the weights are pushed in the trainer's
thread once no batch is in flight (the engine holds one set of weights), then the sampler's thread
drives the in-process engine (LLM.generate) while the trainer's thread updates the policy. The
engine's own log-probabilities of its sampled tokens are the behaviour policy's, stale or not (a
batch that is not stale still carries the engine's numerical mismatch, corrected as the
synchronous vllm run corrects it). Since the engine holds one set of weights, K > 1 keeps the
schedule (batch m sampled by the weights after m - K steps) but not more overlap: a push waits
for the batches in flight, so one batch samples while one step trains.

Sampling seeds torch's global generator (as sample_and_score does); a lock keeps the trainer's own
sampling (the gold judge's, at a checkpoint) from interleaving with it, and nothing else in a step
draws from that generator. A checkpoint waits for the batches in flight and saves them (and the
step of the weights that sampled each) beside the optimizer state, one file per process; --resume
takes them back, so a resumed run trains the batches the uninterrupted one would have."""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from farmkit.train import policy as P

AHEAD_FILE = "rollouts-ahead-{rank}.pt"  # in a checkpoint's trainer/ folder


@dataclass
class Sampled:
    """A batch sampled ahead, before it is scored."""

    number: int  # the step (0-based) it is for
    version: int  # the steps the sampling weights had trained
    rollout: P.Rollout
    behaviour_logprobs: torch.Tensor | None  # the sampling weights' (None where not stale)

    @property
    def staleness(self) -> int:
        return self.number - self.version


def behaviour_logprobs(model: Any, rollout: P.Rollout, temperature: float, size: int) -> Any:
    """`model`'s log-probabilities of the sampled tokens [rows, tokens] (0 on padding), in chunks of
    `size` rows, as the trainer computes its own (the tempered softmax, over the tokens a top-p or
    top-k truncation kept where the rollout records them: policy.replayed_logits)."""
    parts = []
    with torch.no_grad():
        for start in range(0, rollout.response_ids.shape[0], size):
            chunk = rollout.rows(slice(start, start + size))
            logits = P.replayed_logits(P.response_logits(model, chunk, temperature), chunk)
            parts.append(P.token_logprobs(logits, chunk.response_ids))
    return torch.cat(parts) * rollout.response_mask


class _Copy:
    """A copy of the policy and the batches in flight that sample from it."""

    def __init__(self, model: Any) -> None:
        self.model, self.futures = model, []

    @property
    def free(self) -> bool:
        return all(future.done() for future in self.futures)


class AheadSampler:
    """The batches of the next steps, asked for in step order and sampled by one thread.
    `sample(model, number)`: step `number`'s rollout sampled by `model` (its seed, prompts and
    settings are the trainer's); `autocast`: the trainer's precision context (thread-local, so
    entered in the thread); `size`: rows per pass of the behaviour log-probabilities. `sample`
    returns (rollout, the engine's log-probabilities of its tokens or None where the model sampled
    itself). `push(policy)`: where an engine samples (vllm), hand it the policy's weights; there are
    then no copies, `sample` gets the policy itself (for its device only)."""

    def __init__(
        self,
        staleness: int,
        steps: int,
        sample: Callable[[Any, int], tuple[P.Rollout, torch.Tensor | None]],
        temperature: float,
        size: int,
        autocast: Callable[[], Any],
        push: Callable[[Any], None] | None = None,
    ) -> None:
        self.staleness, self.steps, self.sample = staleness, steps, sample
        self.temperature, self.size, self.autocast = temperature, size, autocast
        self.push = push
        self.lock = threading.Lock()  # held while torch's global generator samples
        self.pending: dict[int, Future] = {}
        self.copies: list[_Copy] = []
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="farmkit-rollouts")

    def take(self, number: int, policy: Any) -> Sampled:
        """Step `number`'s batch; the batches up to number + K not yet asked for are asked for
        from `policy`'s weights now (after `number` steps). A batch asked for before is awaited
        first: the one thread samples in order anyway, and its copy is then free to refill."""
        sampled = self.pending.pop(number).result() if number in self.pending else None
        needed = [
            m
            for m in range(number, min(number + self.staleness, self.steps - 1) + 1)
            if m not in self.pending and (m != number or sampled is None)
        ]
        if needed:
            weights = self._copy_of(policy) if self.push is None else self._engine_with(policy)
            for m in needed:
                future = self.executor.submit(self._sample, weights.model, m, number)
                weights.futures.append(future)
                self.pending[m] = future
        return sampled if sampled is not None else self.pending.pop(number).result()

    def _copy_of(self, policy: Any) -> _Copy:
        """A copy of `policy`'s weights now: one no batch in flight samples from, refilled, or a
        new one."""
        for held in self.copies:
            if held.free:
                with torch.no_grad():
                    held.model.load_state_dict(policy.state_dict())
                held.futures = []
                return held
        model = copy.deepcopy(policy)
        model.requires_grad_(False)
        model.eval()
        self.copies.append(_Copy(model))
        return self.copies[-1]

    def _engine_with(self, policy: Any) -> _Copy:
        """The engine given `policy`'s weights now, once the batches in flight (sampled by the
        weights it holds) are done."""
        for future in self.pending.values():
            future.result()
        self.push(policy)
        return _Copy(policy)

    def _sample(self, model: Any, number: int, version: int) -> Sampled:
        with self.autocast():
            with self.lock:
                rollout, logprobs = self.sample(model, number)
            # an engine's (vllm) are those of the weights it held; where the copy sampled and the
            # batch is stale, the ratio needs the copy's own
            if logprobs is None and version < number:
                logprobs = behaviour_logprobs(model, rollout, self.temperature, self.size)
        return Sampled(number, version, rollout, logprobs)

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self, state: Path, rank: int) -> None:
        """The batches asked for (awaited) into a checkpoint's trainer/ folder, whole or not at
        all."""
        batches = []
        for number in sorted(self.pending):
            sampled = self.pending[number].result()
            rollout = sampled.rollout.to("cpu")
            batches.append(
                {
                    "number": sampled.number,
                    "version": sampled.version,
                    "rollout": [rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids]
                    + [rollout.response_mask, rollout.finished],
                    "behaviour_logprobs": None
                    if sampled.behaviour_logprobs is None
                    else sampled.behaviour_logprobs.cpu(),
                }
            )
        target = state / AHEAD_FILE.format(rank=rank)
        partial = target.with_name(target.name + ".partial")
        torch.save(batches, partial)
        os.replace(partial, target)

    def restore(self, state: Path | None, rank: int, device: Any) -> None:
        """The batches a checkpoint saved (none where it has no file: a run written without
        --async-rollouts samples its next batch afresh)."""
        source = None if state is None else state / AHEAD_FILE.format(rank=rank)
        if source is None or not source.is_file():
            return
        for saved in torch.load(source, weights_only=True):
            behaviour = saved["behaviour_logprobs"]
            future: Future = Future()
            future.set_result(
                Sampled(
                    saved["number"],
                    saved["version"],
                    P.Rollout(*saved["rollout"]).to(device),
                    None if behaviour is None else behaviour.to(device),
                )
            )
            self.pending[saved["number"]] = future

    def close(self) -> None:
        """Stop: the batch being sampled finishes, those not started are dropped."""
        self.executor.shutdown(wait=True, cancel_futures=True)
