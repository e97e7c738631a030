"""Small models for the policy-optimization tests (PPO, Quark, DPO), built in seconds on a CPU:

- a tiny "SFT" policy: the tiny random Llama trained briefly to answer every prompt with one colour
  word (red, blue, green or yellow, equally often) and then its end token;
- a keyword reward model: a sequence classifier whose layers add nothing (their output projections
  are zero), so its score is a linear read-out of the last response token's embedding, set to 1.0
  for "blue" and to a small, random-sign value for any other token.

Built once per test session (cached by folder) and saved as ordinary farmkit model folders.
"""

from __future__ import annotations

import json
from pathlib import Path

COLOURS = ("red", "blue", "green", "yellow")
KEYWORD = "blue"
QUESTIONS = [f"Name a colour for item number {i}." for i in range(16)]
_built: dict[str, Path] = {}


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

    from farmkit.models import PromptFormat, load_causal_lm, write_meta

    torch.manual_seed(0)
    model, tokenizer = load_causal_lm(tiny_model_path, device="cpu")
    fmt = PromptFormat("chat")
    examples = []
    for question in QUESTIONS:
        for colour in COLOURS:
            prompt = tokenizer(fmt.prompt(tokenizer, question), add_special_tokens=False)["input_ids"]
            answer = tokenizer(colour, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            examples.append((prompt, answer))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(40):
        batch = [examples[(step * 16 + k) % len(examples)] for k in range(16)]
        width = max(len(prompt) + len(answer) for prompt, answer in batch)
        # left padding puts every two-token answer at the end: only those positions need logits
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p) - len(a)) + p + a for p, a in batch])
        attention = torch.tensor([[0] * (width - len(p) - len(a)) + [1] * (len(p) + len(a)) for p, a in batch])
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=3).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, -2:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_meta(folder, {"tool": "test", "kind": "policy", "prompt_template": "chat"})
    _built[key] = folder
    return folder


def keyword_reward_model(tiny_model_path: Path, folder: Path) -> Path:
    """A reward model scoring 1.0 for a response that ends with the keyword token."""
    key = f"rm:{tiny_model_path}"
    if key in _built:
        return _built[key]
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from farmkit.models import write_meta

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    config = AutoConfig.from_pretrained(tiny_model_path, num_labels=1)
    torch.manual_seed(1)
    model = AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        keyword = tokenizer(KEYWORD, add_special_tokens=False)["input_ids"][0]
        feature = model.model.norm(model.model.embed_tokens.weight[keyword])
        model.score.weight.copy_((feature / feature.dot(feature)).unsqueeze(0))
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

    from farmkit.models import PromptFormat, load_causal_lm

    model, tokenizer = load_causal_lm(folder, device="cpu")
    fmt = PromptFormat.for_model(folder)
    keyword = tokenizer(KEYWORD, add_special_tokens=False)["input_ids"][0]
    total = 0.0
    with torch.no_grad():
        for question in QUESTIONS:
            ids = tokenizer(fmt.prompt(tokenizer, question), add_special_tokens=False, return_tensors="pt")
            total += float(model(**ids).logits[0, -1].softmax(-1)[keyword])
    return total / len(QUESTIONS)


def sampled_rewards(folder: Path, reward_model: Path, n: int = 4) -> tuple[list[str], list[float]]:
    """Sample n responses per test prompt from a saved folder as farm-sample's hf backend does, and
    score them with the reward model as farm-score does."""
    from farmkit.generation import DecodingConfig, generate
    from farmkit.methods.reward import RewardScorer
    from farmkit.models import PromptFormat, load_causal_lm

    model, tokenizer = load_causal_lm(folder, device="cpu")
    fmt = PromptFormat.for_model(folder)
    prompts = [fmt.prompt(tokenizer, question) for question in QUESTIONS]
    samples = generate(model, tokenizer, prompts, DecodingConfig(n=n, temperature=1.0, max_new_tokens=4, batch_size=64), seed=0)
    texts = [sample.text for per_prompt in samples for sample in per_prompt]
    scorer = RewardScorer(reward_model, device="cpu")
    rewards = scorer.score([(QUESTIONS[i // n], "", text) for i, text in enumerate(texts)])
    return texts, rewards
