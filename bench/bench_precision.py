"""CPU seconds per training step in float32 against bf16 autocast (float32 master weights), for the
steps farmkit's trainers take, on the embedded model at the demo's settings, in one process.

Steps (each its trainer's arithmetic, written out on torch and transformers so both precisions run
the same code; the trainers' own bookkeeping is the same either way and left out):
- sft: a causal-LM forward, the masked token loss, backward, AdamW (farm-sft, expert iteration);
- rm: a sequence-classification forward on the chosen and rejected texts, the Bradley-Terry loss,
  backward, AdamW (farm-rm-train);
- dpo: the policy's forward on chosen and rejected with gradient, the frozen reference's without,
  the DPO loss, backward, AdamW (farm-dpo, online DPO);
- ppo-update: a forward on rollout rows with gradient, a clipped policy loss, backward, AdamW
  (PPO, GRPO, RLOO, Quark's update);
- decode: `generate` of max-new-tokens tokens for a batch of prompts (the rollouts' sampling).

Batch: the demo's (TRAIN_BATCH 8, MAX_NEW_TOKENS 32) on the demo's data (examples/data), chat
template applied. Each step runs first once in both precisions (warm-up, untimed), then
`--rounds` times alternating fp32 / bf16 / bf16 / fp32..., each timed on the process's CPU clock
(the machine is shared: wall time measures the other tenants), one torch thread; the median of
each side is compared. With `--curve N`, also the loss over N SFT and N reward-model steps from
the same start, both ways, to see that bf16 autocast learns as fp32 does.

    python bench/bench_precision.py                      # 4 rounds of every step (make bench)
    python bench/bench_precision.py --steps "" --curve 20    # the loss curves alone

Prints a table on stderr and one JSON line per ratio (bf16 / fp32 CPU seconds) on stdout.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "examples" / "data" / "instructions.jsonl"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--curve", type=int, default=0, help="steps of the loss curves (0: none)")
    parser.add_argument("--steps", default="sft,rm,dpo,ppo-update,decode")
    parser.add_argument("--curves", default="sft,rm", help="whose loss curves --curve draws")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from farmkit.lm.models import load_tokenizer, resolve
    from farmkit.train.precision import cpu_supports_bf16

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    path = resolve("embedded")
    tokenizer = load_tokenizer(path, padding_side="right")
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]

    def chat(row: dict) -> tuple[list[int], list[int]]:
        user = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer = tokenizer(row["output"] + tokenizer.eos_token, add_special_tokens=False)
        return prompt_ids, answer["input_ids"]

    def batch(start: int, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """input ids, attention mask, loss mask (the answer's tokens), right-padded."""
        pairs = [chat(rows[i % len(rows)]) for i in range(start, start + size)]
        width = max(len(p) + len(a) for p, a in pairs)
        ids = torch.full((size, width), tokenizer.pad_token_id)
        attention = torch.zeros((size, width), dtype=torch.long)
        loss_mask = torch.zeros((size, width), dtype=torch.bool)
        for i, (p, a) in enumerate(pairs):
            ids[i, : len(p) + len(a)] = torch.tensor(p + a)
            attention[i, : len(p) + len(a)] = 1
            loss_mask[i, len(p) : len(p) + len(a)] = True
        return ids, attention, loss_mask

    def token_logps(model, ids, attention, mask):
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        logps = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return logps * mask[:, 1:]

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    base.config.use_cache = True
    reference = copy.deepcopy(base).eval().requires_grad_(False)
    tokenizer.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id

    def causal() -> tuple:
        model = copy.deepcopy(base).train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-5)

    def classifier() -> tuple:
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=torch.float32
        )
        model.config.pad_token_id = tokenizer.pad_token_id
        return model.train(), torch.optim.AdamW(model.parameters(), lr=5e-5)

    def sft_loss(model, step):
        ids, attention, mask = batch(step * args.batch, args.batch)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        target = ids[:, 1:].masked_fill(~mask[:, 1:], -100)
        return F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=-100)

    def rm_loss(model, step):
        # pairs: two answers to the same prompt (the chosen one the demo's, the rejected another's)
        chosen = batch(step * args.batch, args.batch)
        rejected = batch(step * args.batch + 7, args.batch)
        ids = torch.nn.utils.rnn.pad_sequence(
            [*chosen[0], *rejected[0]], batch_first=True, padding_value=tokenizer.pad_token_id
        )
        attention = torch.nn.utils.rnn.pad_sequence([*chosen[1], *rejected[1]], batch_first=True)
        scores = model(input_ids=ids, attention_mask=attention).logits.float().squeeze(-1)
        return -F.logsigmoid(scores[: args.batch] - scores[args.batch :]).mean()

    def dpo_loss(model, step):
        chosen = batch(step * args.batch, args.batch)
        rejected = batch(step * args.batch + 7, args.batch)
        width = max(chosen[0].shape[1], rejected[0].shape[1])

        def pad(t, value):
            return F.pad(t, (0, width - t.shape[1]), value=value)

        ids = torch.cat([pad(chosen[0], tokenizer.pad_token_id), pad(rejected[0], 0)])
        attention = torch.cat([pad(chosen[1], 0), pad(rejected[1], 0)])
        mask = torch.cat([pad(chosen[2], False), pad(rejected[2], False)])
        policy = token_logps(model, ids, attention, mask).sum(-1)
        with torch.no_grad():
            ref = token_logps(reference, ids, attention, mask).sum(-1)
        margin = (policy - ref)[: args.batch] - (policy - ref)[args.batch :]
        return -F.logsigmoid(0.1 * margin).mean()

    def ppo_loss(model, step):
        ids, attention, mask = batch(step * args.batch, args.batch)
        logps = token_logps(model, ids, attention, mask)
        old = logps.detach()
        ratio = torch.exp(logps - old)
        advantages = torch.randn(logps.shape, generator=torch.Generator().manual_seed(step))
        loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
        return (loss * mask[:, 1:]).sum() / mask[:, 1:].sum()

    steps = {"sft": (causal, sft_loss), "rm": (classifier, rm_loss), "dpo": (causal, dpo_loss)}
    steps["ppo-update"] = (causal, ppo_loss)

    def train_step(model, optimizer, loss_fn, step, bf16):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model, step)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def decode(bf16: bool, step: int) -> None:
        prompts = [chat(rows[(step * args.batch + i) % len(rows)])[0] for i in range(args.batch)]
        width = max(map(len, prompts))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        torch.manual_seed(step)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            reference.generate(
                input_ids=ids,
                attention_mask=attention,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=args.max_new_tokens,
                min_new_tokens=args.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )

    wanted = [name for name in args.steps.split(",") if name]  # "": the curves alone
    seconds: dict[str, dict[bool, list[float]]] = {}
    for name in wanted:
        seconds[name] = {False: [], True: []}
        if name == "decode":

            def run(bf16, step):
                decode(bf16, step)

        else:
            make, loss_fn = steps[name]
            model, optimizer = make()

            def run(bf16, step, model=model, optimizer=optimizer, loss_fn=loss_fn):
                train_step(model, optimizer, loss_fn, step, bf16)
                assert next(model.parameters()).dtype == torch.float32

        for bf16 in (False, True):
            run(bf16, 0)  # warm-up, untimed
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for bf16 in order:
                started = time.process_time()
                run(bf16, r + 1)
                seconds[name][bf16].append(time.process_time() - started)
        print(f"  {name}: done", file=sys.stderr, flush=True)

    print(f"cpu bf16 flags: {cpu_supports_bf16()}  threads: {args.threads}", file=sys.stderr)
    print(f"{'step':<12}{'fp32 s':>9}{'bf16 s':>9}{'ratio':>8}", file=sys.stderr)
    for name, both in seconds.items():
        fp32, bf16 = statistics.median(both[False]), statistics.median(both[True])
        ratio = bf16 / fp32
        print(f"{name:<12}{fp32:>9.3f}{bf16:>9.3f}{ratio:>8.2f}", file=sys.stderr)
        print(
            json.dumps(
                {
                    "benchmark": "precision",
                    "figure": f"{name} step, bf16 autocast / fp32 CPU seconds",
                    "value": bf16,
                    "unit": "CPU s",
                    "peer": "fp32",
                    "peer_value": fp32,
                    "ratio": ratio,
                    "target": "< 1",
                    "met": ratio < 1,
                }
            ),
            flush=True,
        )

    for name in [name for name in args.curves.split(",") if name] if args.curve else ():
        make, loss_fn = steps[name]
        curves = {}
        for bf16 in (False, True):
            torch.manual_seed(1)
            model, optimizer = make()
            # the same start both ways (the reward model's new score head drawn from this seed)
            curves[bf16] = []
            for step in range(args.curve):
                curves[bf16].append(train_step(model, optimizer, loss_fn, step, bf16))
                label = "bf16" if bf16 else "fp32"
                print(f"  {name} {label} step {step}: {curves[bf16][-1]:.4f}", file=sys.stderr)
        print(f"{name} loss curve (every 5th step): fp32 / bf16", file=sys.stderr)
        for step in range(0, args.curve, 5):
            print(
                f"  {step:>3}  {curves[False][step]:.4f}  {curves[True][step]:.4f}", file=sys.stderr
            )
        for bf16 in (False, True):
            first = statistics.mean(curves[bf16][:5])
            last = statistics.mean(curves[bf16][-5:])
            label = "bf16" if bf16 else "fp32"
            print(f"  {label}: mean of first 5 {first:.4f}, of last 5 {last:.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
