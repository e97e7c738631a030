"""Small models for the policy-optimization tests (PPO, Quark, DPO), built in seconds on a CPU:

- a tiny "SFT" policy: the tiny random Llama trained briefly to answer every prompt with one colour
  word (red, blue, green or yellow, equally often) and then its end token;
- a keyword reward model: a sequence classifier whose score, read at the last token, is 1.0 when
  the token before it is "blue" and exactly 0 otherwise: for a finished response, 1.0 when its last
  word before the end token is the keyword. One attention head looks one position back; every
  other sublayer adds nothing.

Built once per test session (cached by folder) and saved as ordinary farmkit model folders.
"""

from __future__ import annotations

import json
from pathlib import Path

COLOURS = ("red", "blue", "green", "yellow")
KEYWORD = "blue"
QUESTIONS = [f"Name a colour for item number {i}." for i in range(16)]
_built: dict[str, Path] = {}
# RLOO and GRPO on the tiny model: 8 groups of 4 a step, two passes, a high learning rate
GROUP_SETTINGS = dict(
    rollout_batch_size=32,
    samples_per_prompt=4,
    minibatch_size=16,
    micro_batch_size=16,
    ppo_epochs=2,
    learning_rate=2e-3,
    kl_coef=0.05,
    temperature=1.0,
    max_new_tokens=4,
)


def prompt_records(n: int = 16) -> list[dict]:
    return [{"instruction": QUESTIONS[i % len(QUESTIONS)], "input": ""} for i in range(n)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def tiny_sft(tiny_model_path: Path, folder: Path) -> Path:
    """Train the tiny model (40 steps) to answer with a uniformly chosen colour word."""
    key = f"sft:{tiny_model_path}"
    if key in _built:
        return _built[key]
    import torch

    from farmkit.lm.models import PromptFormat, load_causal_lm, write_meta

    torch.manual_seed(0)
    model, tokenizer = load_causal_lm(tiny_model_path, device="cpu")
    fmt = PromptFormat("chat")
    examples = []
    for question in QUESTIONS:
        for colour in COLOURS:
            prompt = tokenizer(fmt.prompt(tokenizer, question), add_special_tokens=False)[
                "input_ids"
            ]
            answer = tokenizer(colour, add_special_tokens=False)["input_ids"] + [
                tokenizer.eos_token_id
            ]
            examples.append((prompt, answer))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(40):
        batch = [examples[(step * 16 + k) % len(examples)] for k in range(16)]
        width = max(len(prompt) + len(answer) for prompt, answer in batch)
        # left padding puts every two-token answer at the end: only those positions need logits
        ids = torch.tensor(
            [[tokenizer.pad_token_id] * (width - len(p) - len(a)) + p + a for p, a in batch]
        )
        attention = torch.tensor(
            [[0] * (width - len(p) - len(a)) + [1] * (len(p) + len(a)) for p, a in batch]
        )
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        logits = model(
            input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=3
        ).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, -2:].reshape(-1)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_meta(folder, {"tool": "test", "kind": "policy", "prompt_template": "chat"})
    _built[key] = folder
    return folder


def keyword_reward_model(tiny_model_path: Path, folder: Path, keyword: str = KEYWORD) -> Path:
    """A reward model scoring 1.0 when the token before the scored (last) one is the keyword, else 0
    (by default "blue"; another colour makes a judge that disagrees with it, a gold judge's part).

    Every token embeds to one of two vectors of equal norm: dimension 1 set for the keyword, dimension
    3 for any other, dimension 2 for all. The first layer's queries and keys read dimension 2 alone,
    so their dot product after the rotary embedding depends on the distance only; the keys are turned
    by one step of each rotary frequency, which makes distance 1 win the softmax by far. That head
    carries dimension 1 (the keyword) of the previous token into dimension 0, which the head reads
    after the final norm. Everything else is zero.
    """
    key = f"rm:{tiny_model_path}:{keyword}"
    if key in _built:
        return _built[key]
    import math

    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from farmkit.lm.models import write_meta

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    config = AutoConfig.from_pretrained(tiny_model_path, num_labels=1)
    model = AutoModelForSequenceClassification.from_config(config)
    keyword = tokenizer(keyword, add_special_tokens=False)["input_ids"][0]
    head_dim = config.hidden_size // config.num_attention_heads
    base = config.rope_parameters["rope_theta"]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for norm in [model.model.norm] + [
            n
            for layer in model.model.layers
            for n in (layer.input_layernorm, layer.post_attention_layernorm)
        ]:
            norm.weight.fill_(1.0)
        embeddings = model.model.embed_tokens.weight
        embeddings[:, 2] = 1.0
        embeddings[:, 3] = 1.0
        embeddings[keyword, 3] = 0.0
        embeddings[keyword, 1] = 1.0
        attention = model.model.layers[0].self_attn
        for pair in range(head_dim // 2):
            step = base ** (-2 * pair / head_dim)
            attention.q_proj.weight[pair, 2] = 20.0
            attention.k_proj.weight[pair, 2] = math.cos(step)
            attention.k_proj.weight[pair + head_dim // 2, 2] = math.sin(step)
        attention.v_proj.weight[0, 1] = 1.0  # key-value head 0, its first dimension: the keyword
        attention.o_proj.weight[0, 0] = (
            10.0  # query head 0 (which reads key-value head 0) into dimension 0
        )
        model.score.weight[0, 0] = config.hidden_size**-0.5
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_meta(folder, {"tool": "test", "kind": "reward_model", "prompt_template": "chat"})
    _built[key] = folder
    return folder


def keyword_fraction(texts: list[str]) -> float:
    return sum(text == KEYWORD for text in texts) / len(texts)


def keyword_probability(folder: Path) -> float:
    """Mean probability, over the test prompts, that the first response token is the keyword, with
    the prompt formatted as farm-sample formats it for this folder (control token included)."""
    import torch

    from farmkit.lm.models import PromptFormat, load_causal_lm

    model, tokenizer = load_causal_lm(folder, device="cpu")
    fmt = PromptFormat.for_model(folder)
    keyword = tokenizer(KEYWORD, add_special_tokens=False)["input_ids"][0]
    total = 0.0
    with torch.no_grad():
        for question in QUESTIONS:
            ids = tokenizer(
                fmt.prompt(tokenizer, question), add_special_tokens=False, return_tensors="pt"
            )
            total += float(model(**ids).logits[0, -1].softmax(-1)[keyword])
    return total / len(QUESTIONS)


def sampled_rewards(folder: Path, reward_model: Path, n: int = 4) -> tuple[list[str], list[float]]:
    """Sample n responses per test prompt from a saved folder as farm-sample's hf backend does, and
    score them with the reward model as farm-score does."""
    from farmkit.lm.generation import DecodingConfig, generate
    from farmkit.lm.models import PromptFormat, load_causal_lm
    from farmkit.train.scoring import RewardScorer

    model, tokenizer = load_causal_lm(folder, device="cpu")
    fmt = PromptFormat.for_model(folder)
    prompts = [fmt.prompt(tokenizer, question) for question in QUESTIONS]
    samples = generate(
        model,
        tokenizer,
        prompts,
        DecodingConfig(n=n, temperature=1.0, max_new_tokens=4, batch_size=64),
        seed=0,
    )
    texts = [sample.text for per_prompt in samples for sample in per_prompt]
    scorer = RewardScorer(reward_model, device="cpu")
    rewards = scorer.score([(QUESTIONS[i // n], "", text) for i, text in enumerate(texts)])
    return texts, rewards


def spy_generate(monkeypatch) -> list[dict]:
    """Make every generate() call also record what it sampled from: per call, the sampled response
    tokens [batch, steps] and the processed (post-warper) scores [batch, steps, vocab]."""
    import torch
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate
    calls: list[dict] = []

    def generate(self, *args, **kwargs):
        output = original(
            self, *args, **{**kwargs, "output_scores": True, "return_dict_in_generate": True}
        )
        width = kwargs["input_ids"].shape[1]
        calls.append(
            {
                "tokens": output.sequences[:, width:],
                "scores": torch.stack(output.scores, dim=1),
                "temperature": kwargs.get("temperature"),
                "prompts": kwargs["input_ids"],
                "prompt_mask": kwargs["attention_mask"],
            }
        )
        return output.sequences

    monkeypatch.setattr(GenerationMixin, "generate", generate)
    return calls


def sampled_logprobs(call: dict):
    """Log-probabilities of the sampled tokens under generate()'s processed scores."""
    import torch

    return (
        torch.log_softmax(call["scores"].float(), dim=-1)
        .gather(-1, call["tokens"].unsqueeze(-1))
        .squeeze(-1)
    )


def spy_adamw(monkeypatch) -> list:
    """Record every torch.optim.AdamW a trainer creates."""
    import torch

    created = []

    class Recorded(torch.optim.AdamW):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

    monkeypatch.setattr(torch.optim, "AdamW", Recorded)
    return created


def spy_loads(monkeypatch) -> list:
    """Record every causal LM that farmkit.lm.models.load_causal_lm returns."""
    import farmkit.lm.models

    original = farmkit.lm.models.load_causal_lm
    loaded: list = []

    def load(*args, **kwargs):
        network, tokenizer = original(*args, **kwargs)
        loaded.append(network)
        return network, tokenizer

    monkeypatch.setattr(farmkit.lm.models, "load_causal_lm", load)
    return loaded


def pretend_bf16_gpu(monkeypatch) -> None:
    """Make dtype 'auto' resolve as it does on a bf16-capable GPU (the CPU stand-in for bug 2)."""
    import torch

    import farmkit.lm.models

    original = farmkit.lm.models.choose_dtype
    monkeypatch.setattr(
        farmkit.lm.models,
        "choose_dtype",
        lambda device, dtype="auto": torch.bfloat16 if dtype == "auto" else original(device, dtype),
    )


def variant(
    folder: Path, target: Path, config: dict | None = None, generation: dict | None = None
) -> Path:
    """A copy of a model folder with config.json / generation_config.json fields changed."""
    import shutil

    shutil.copytree(folder, target)
    for name, changes in (("config.json", config), ("generation_config.json", generation)):
        if changes:
            path = target / name
            current = json.loads(path.read_text()) if path.exists() else {}
            path.write_text(json.dumps({**current, **changes}))
    return target


BUDGET = ("labels_used", "tokens_sampled", "training_tokens", "wall_seconds")
RUNNING = ("labels_used", "tokens_sampled", "training_tokens")


def check_budget(
    folder: Path,
    method: str,
    labels_used: int | None,
    samples: bool = True,
    trains: bool = True,
    metrics: Path | None = None,
    within: float | None = None,
) -> dict:
    """The budget every policy method keeps (farmkit.train.budget): meta.json's `budget` block
    with its four figures, and the same figures as running totals on every metrics row (that never
    fall and end at the block's totals). within: the seconds the test measured around the run, which
    the run's own wall-clock time cannot exceed. Returns the block."""
    from farmkit.core.validate import problems

    budget = json.loads((folder / "meta.json").read_text())["budget"]
    assert set(BUDGET) <= set(budget), budget
    assert budget["labels_used"] == labels_used
    assert (budget["tokens_sampled"] > 0) == samples, budget
    assert (budget["training_tokens"] > 0) == trains, budget
    path = metrics or folder / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows and all(row["method"] == method for row in rows)
    # the run's wall-clock time covers every row it logged (a resumed run's earlier time included);
    # TRL's rows (DPO, expert iteration's SFT) carry no elapsed_s to compare with
    elapsed = [row["elapsed_s"] for row in rows if row.get("elapsed_s") is not None]
    assert budget["wall_seconds"] >= max(elapsed, default=0.0) - 0.01, (budget, elapsed)
    assert budget["wall_seconds"] > 0
    if within is not None:
        assert budget["wall_seconds"] <= within, (budget["wall_seconds"], within)
    for row in rows:
        assert problems(row, "metrics") is None, row
        assert set(RUNNING) <= set(row), row
    if labels_used is None:  # a reward model that does not say what trained it
        assert all(row["labels_used"] is None for row in rows)
    names = ("tokens_sampled", "training_tokens") + (("labels_used",) if labels_used else ())
    for name in names:
        totals = [row[name] for row in rows]
        assert totals == sorted(totals), (name, totals)
        assert totals[-1] == budget[name], (name, totals, budget)
    return budget


def ends_often(tiny_model_path: Path, folder: Path, eos_probability: float = 0.15) -> Path:
    """The tiny random model, made to end an answer at each step with about `eos_probability`
    (measured on the first response token of a few prompts), so that a sampling test sees finished
    and unfinished answers side by side whatever the seed (the random model alone ends one answer
    in tens of thousands of tokens).

    Dimension 0 of every token embedding becomes 1, a direction the final norm passes on to every
    position's hidden state; the end token's row gets `extra` more of it, which raises its logit
    (and only its logit: the rest shift together) by an amount bisected to the wanted probability."""
    import torch

    from farmkit.lm.models import PromptFormat, load_causal_lm

    model, tokenizer = load_causal_lm(tiny_model_path, device="cpu")
    fmt = PromptFormat("chat")
    prompts = [
        tokenizer(fmt.prompt(tokenizer, question), add_special_tokens=False, return_tensors="pt")
        for question in QUESTIONS[:4]
    ]
    embeddings = model.get_input_embeddings().weight
    eos = tokenizer.eos_token_id

    def probability(extra: float) -> float:
        with torch.no_grad():
            embeddings[:, 0] = 1.0
            embeddings[eos, 0] = 1.0 + extra
            return sum(float(model(**ids).logits[0, -1].softmax(-1)[eos]) for ids in prompts) / len(
                prompts
            )

    low, high = 0.0, 8.0
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if probability(middle) < eos_probability else (low, middle)
    reached = probability(high)
    assert abs(reached - eos_probability) < 0.05, reached
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class FakePairJudge:
    """A judge of pairs (farmkit.train.pairwise.PairJudge) whose verdicts are known: `better(a, b)`
    says whether output a beats b (neither way: a tie); each pair costs `price` USD and is recorded
    in `asked`, one list a call."""

    def __init__(self, better, price: float = 0.0, max_cost: float | None = None) -> None:
        self.better, self.price, self.max_cost = better, price, max_cost
        self.asked: list[list[dict]] = []

    def preferences(self, pairs, seed, budget):
        if budget is not None and self.price * len(pairs) > budget:
            return None
        self.asked.append(pairs)
        verdicts = []
        for pair in pairs:
            first, second = pair["output_1"], pair["output_2"]
            verdicts.append(
                1.0 if self.better(first, second) else 2.0 if self.better(second, first) else 1.5
            )
        cost = {
            "pairs": len(pairs),
            "requests": len(pairs),
            "judge_calls": len(pairs),
            "cache_hits": 0,
            "price": self.price * len(pairs),
        }
        return verdicts, cost
