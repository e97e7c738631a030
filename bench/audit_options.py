"""Audit of issue 22's option items with cases the tests do not use: one name per idea (and the old
names still working, hidden), --device on the trainers, --resume after an interruption (one a real
SIGKILL), LoRA on farm-quark and farm-expiter. Not part of the test suite.

    python bench/audit_options.py [--root DIR] [--no-models]

--root: the checkout whose farmkit and tools/ are audited (default: this one), e.g. an export of
the commit before the fixes. Prints one line per check and a summary of passes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
parser = argparse.ArgumentParser()
parser.add_argument("--root", type=Path, default=HERE)
parser.add_argument("--no-models", action="store_true")
options = parser.parse_args()
ROOT = options.root.resolve()
sys.path[:0] = [str(ROOT), str(HERE / "tests")]
import farmkit  # noqa: E402

tools = types.ModuleType("farmkit.tools")
tools.__path__ = [str(ROOT / "tools")]
sys.modules["farmkit.tools"] = tools
farmkit.tools = tools
import click  # noqa: E402

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append((name, ok, detail))
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)


def command(tool: str) -> click.Command:
    return importlib.import_module(f"farmkit.tools.{tool.replace('-', '_')}").cli


HEADS = {
    "farm-sample": ["m", "p"],
    "farm-bon": ["s", "r", "p"],
    "farm-expiter": ["s", "r", "p", "-o", "o"],
    "farm-sft": ["m", "d", "-o", "o"],
    "farm-rm-train": ["m", "p", "-o", "o"],
    "farm-dpo": ["m", "p", "-o", "o"],
    "farm-ppo": ["s", "r", "p", "-o", "o"],
    "farm-rloo": ["s", "r", "p", "-o", "o"],
    "farm-grpo": ["s", "r", "p", "-o", "o"],
    "farm-quark": ["s", "r", "p", "-o", "o"],
    "farm-correlate": ["a.csv", "b.csv"],
}


def parses(tool: str, args: list[str]) -> tuple[bool, str]:
    try:
        with command(tool).make_context(tool, [*HEADS[tool], *args]):
            return True, ""
    except click.exceptions.UsageError as exc:
        return False, exc.format_message()


def visible_flags(tool: str) -> set[str]:
    cmd = command(tool)
    return {
        flag
        for param in cmd.params
        if isinstance(param, click.Option) and not param.hidden
        for flag in param.opts + param.secondary_opts
    }


# --- 1. one name per idea -------------------------------------------------------------------
IDEAS = {
    # idea: (canonical flag, value, tools that have the idea, the spellings known for it)
    "samples per prompt": (
        "--num-samples",
        "5",
        ["farm-sample", "farm-bon", "farm-expiter", "farm-quark", "farm-rloo", "farm-grpo"],
        ["--num-samples", "--samples-per-prompt"],
    ),
    "learning-rate schedule": (
        "--lr-scheduler-type",
        "constant",
        ["farm-sft", "farm-quark"],
        ["--lr-scheduler-type", "--lr-scheduler", "--lr-schedule"],
    ),
    "checkpoint every N steps": (
        "--save-steps",
        "9",
        ["farm-sft", "farm-ppo", "farm-rloo", "farm-grpo"],
        ["--save-steps", "--checkpoint-every"],
    ),
}
for idea, (flag, value, having, spellings) in IDEAS.items():
    accepted = [tool for tool in having if parses(tool, [flag, value])[0]]
    check(
        f"names: {idea}: {flag} accepted",
        len(accepted) == len(having),
        f"{len(accepted)}/{len(having)} tools",
    )
    shown = {s for tool in having for s in spellings if s in visible_flags(tool)}
    check(f"names: {idea}: one visible spelling", len(shown) == 1, f"visible: {sorted(shown)}")

OLD = [
    ("farm-quark", ["--samples-per-prompt", "6"]),
    ("farm-grpo", ["--samples-per-prompt", "6"]),
    ("farm-sft", ["--lr-scheduler", "cosine_with_restarts"]),
    ("farm-quark", ["--lr-schedule", "linear"]),
    ("farm-rloo", ["--checkpoint-every", "11"]),
    ("farm-ppo", ["--checkpoint-every", "13"]),
    ("farm-correlate", ["--labels", "7"]),
]
kept = [(tool, args[0]) for tool, args in OLD if parses(tool, args)[0]]
check("names: old spellings still work", len(kept) == len(OLD), f"{len(kept)}/{len(OLD)}")
meanings: dict[str, set[str]] = {}
for tool in ("farm-annotate", "farm-correlate", *HEADS):
    for param in command(tool).params:
        if isinstance(param, click.Option):
            numeric = isinstance(param.type, click.types._NumberParamTypeBase)
            kind = (
                "flag"
                if param.is_flag
                else "file"
                if isinstance(param.type, click.Path)
                else "number"
                if numeric or param.type.name.startswith("n[")
                else "text"
            )
            for flag in param.opts:
                meanings.setdefault(flag, set()).add(kind)
double = sorted(flag for flag, kinds in meanings.items() if len(kinds) > 1)
check("names: no flag with two kinds of value", not double, f"{double}")

# --- 2. --device on the trainers --------------------------------------------------------------
TRAINERS = ["farm-dpo", "farm-ppo", "farm-rloo", "farm-grpo", "farm-rm-train"]
cpu = [tool for tool in TRAINERS if parses(tool, ["--device", "cpu"])[0]]
check("device: --device cpu accepted", len(cpu) == len(TRAINERS), f"{len(cpu)}/{len(TRAINERS)}")
clear = []
for tool in TRAINERS:
    ok, message = parses(tool, ["--device", "tpu:0"])
    if not ok and "expected auto, cpu, cuda" in message:
        clear.append(tool)
check("device: a bad name is a clear usage error", len(clear) == len(TRAINERS), f"{clear}")


def run(tool: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    code = (
        "import sys, types, farmkit; t = types.ModuleType('farmkit.tools'); "
        f"t.__path__ = [{str(ROOT / 'tools')!r}]; sys.modules['farmkit.tools'] = t; "
        f"from farmkit.tools.{tool.replace('-', '_')} import main; main(sys.argv[1:])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, timeout=timeout, env=env
    )


if options.no_models:
    sys.exit(0)

# --- models ----------------------------------------------------------------------------------
import torch  # noqa: E402
from policy_fixtures import (  # noqa: E402
    keyword_reward_model,
    prompt_records,
    tiny_sft,
    write_jsonl,
)
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from farmkit.lm.models import resolve  # noqa: E402

work = Path(tempfile.mkdtemp(prefix="audit-options-"))
tokenizer = AutoTokenizer.from_pretrained(resolve("embedded"))
tiny = work / "tiny"
torch.manual_seed(3)
LlamaForCausalLM(
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
).save_pretrained(tiny)
tokenizer.save_pretrained(tiny)
sft = tiny_sft(tiny, work / "sft")
rm = keyword_reward_model(tiny, work / "rm")
prompts = write_jsonl(work / "prompts.jsonl", prompt_records(12))
colours = ["red", "blue", "green", "yellow"]
prefs = write_jsonl(
    work / "prefs.jsonl",
    [
        {
            "instruction": f"Pick a colour for box {i}.",
            "output_1": colours[i % 4],
            "output_2": colours[(i + 1) % 4],
            "preference": 1 + (i % 3 == 0),
        }
        for i in range(20)
    ],
)

for tool in ("farm-ppo", "farm-rloo"):
    if torch.cuda.is_available():
        break
    done = run(tool, str(sft), str(rm), str(prompts), "-o", str(work / tool), "--device", "cuda:2")
    last = done.stderr.decode().strip().splitlines()[-1] if done.stderr else ""
    check(
        f"device: {tool} --device cuda:2 without a GPU: one-line error",
        done.returncode == 1 and "no CUDA GPU is visible" in last,
        f"rc {done.returncode}: {last[:140]}",
    )


def max_difference(a: Path, b: Path) -> float | None:
    if not (a / "model.safetensors").exists() or not (b / "model.safetensors").exists():
        return None
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def resume_case(name: str, tool: str, inputs: list[str], args: list[str], stop: str) -> None:
    """An unbroken run, then one killed (SIGKILL) once the state named `stop` exists, resumed with
    --resume: the final weights must match."""
    unbroken, broken = work / f"{name}-unbroken", work / f"{name}-broken"
    first = run(tool, *inputs, "-o", str(unbroken), *args, "-q")
    if first.returncode:
        check(f"resume: {name}", False, first.stderr.decode().strip().splitlines()[-1][:160])
        return
    code = (
        "import sys, types, farmkit; t = types.ModuleType('farmkit.tools'); "
        f"t.__path__ = [{str(ROOT / 'tools')!r}]; sys.modules['farmkit.tools'] = t; "
        f"from farmkit.tools.{tool.replace('-', '_')} import main; main(sys.argv[1:])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", code, *inputs, "-o", str(broken), *args, "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    marker = Path(f"{broken}-checkpoints") / stop
    deadline = time.time() + 600
    while not marker.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    killed = process.poll() is None
    if killed:
        process.send_signal(signal.SIGKILL)
    process.wait()
    if not killed:
        check(f"resume: {name}", False, "the run ended before it could be killed (a race)")
        return
    second = run(tool, *inputs, "-o", str(broken), *args, "--resume", "-q")
    difference = max_difference(unbroken, broken)
    check(
        f"resume: {name} killed after {stop}, resumed",
        second.returncode == 0 and difference == 0.0,
        f"rc {second.returncode}, max |weight difference| {difference}"
        + (
            f": {second.stderr.decode().strip().splitlines()[-1][:140]}"
            if second.returncode
            else ""
        ),
    )


resume_case(
    "rm",
    "farm-rm-train",
    [str(sft), str(prefs)],
    ["--batch-size", "3", "--epochs", "4", "--eval-fraction", "0.1", "--save-steps", "5"],
    "step-000010/trainer/state.json",
)
resume_case(
    "dpo",
    "farm-dpo",
    [str(sft), str(prefs)],
    ["--batch-size", "2", "--epochs", "3", "--learning-rate", "5e-4", "--save-steps", "7"],
    "checkpoint-14/trainer_state.json",
)
quark_args = ["--rounds", "6", "--prompts-per-round", "6", "--num-quantiles", "3", "-n", "3"]
quark_args += ["--batch-size", "6", "--max-new-tokens", "3", "--learning-rate", "2e-3"]
resume_case(
    "quark",
    "farm-quark",
    [str(sft), str(rm), str(prompts)],
    [*quark_args, "--save-steps", "2"],
    "step-000004/trainer/state.json",
)

# --- LoRA --------------------------------------------------------------------------------------
done = run(
    "farm-quark",
    str(sft),
    str(rm),
    str(prompts),
    "-o",
    str(work / "quark-lora"),
    *quark_args[:-4],
    "--rounds",
    "2",
    "--lora",
    "--lora-rank",
    "3",
    "--lora-alpha",
    "6",
    "-q",
)
ranks = []
if done.returncode == 0:
    trained, base = (
        load_file(work / "quark-lora" / "model.safetensors"),
        load_file(sft / "model.safetensors"),
    )
    for key, before in base.items():
        after = trained[key][: before.shape[0]]
        if not torch.equal(after, before):
            ranks.append(int(torch.linalg.matrix_rank((after - before).double(), atol=1e-6)))
check(
    "lora: farm-quark --lora --lora-rank 3 changes weights by rank <= 3",
    done.returncode == 0 and bool(ranks) and max(ranks) <= 3,
    f"rc {done.returncode}, ranks of the changes {sorted(set(ranks))}"
    + (f": {done.stderr.decode().strip().splitlines()[-1][:120]}" if done.returncode else ""),
)
ok, message = parses("farm-expiter", ["--lora", "--lora-rank", "3", "--lora-alpha", "6"])
check("lora: farm-expiter --lora-rank/--lora-alpha accepted", ok, message[:100])

passed = sum(ok for _, ok, _ in RESULTS)
print(f"\n{passed}/{len(RESULTS)} checks pass ({ROOT})")
