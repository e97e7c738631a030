"""Audit of issue 22's "Use" items on fresh cases (not the tests' own): prints one JSON line per case
and a summary. Run it with the project's venv Python; ROOT is the checkout whose examples/ are run
(its .venv must exist); PYTHONPATH=OTHER runs another farmkit (the code before a fix) with the same
packages.

    python bench/audit_use.py ROOT [--only recipes,warmup,plot,names]

recipes: examples' recipes from a shell whose PATH lacks the venv (no activation)
warmup:  the first optimizer step's learning rate and the steps a short run logs, in each trainer
plot:    farm-plot SUBCOMMAND -h on stdout, and --version after a subcommand
names:   a mistyped model name fails at once, naming `embedded`"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
BARE = "/usr/bin:/bin"
results: list[bool] = []


def report(area: str, case: str, ok: bool, **seen) -> None:
    results.append(ok)
    print(json.dumps({"area": area, "case": case, "ok": ok, **seen}, default=str), flush=True)


def tool(*args: str, env: dict | None = None, timeout: float = 300):
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(BIN / args[0]), *args[1:]],
            capture_output=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        return None, timeout
    return done, time.monotonic() - started


# ---------------------------------------------------------------------------------------------


def recipes(root: Path, work: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS")
    }
    env.update(PATH=BARE, OMP_NUM_THREADS="1")

    def make(*args: str, directory: Path | None = None):
        where = ["-C", str(directory)] if directory else []
        return subprocess.run(
            ["make", "--no-print-directory", *where, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            cwd=root,
        )

    # PandaLM's layout, three labellers, 5 pairs
    humans = work / "pandalm.json"
    humans.write_text(
        json.dumps(
            [
                {"instruction": f"Explain item {i}.", "input": "", "response1": "Short.",
                 "response2": "A fuller explanation of the item. " * (1 + i % 2),
                 "annotator1": 1 + i % 2, "annotator2": 2, "annotator3": 0}
                for i in range(5)
            ]
        )
    )  # fmt: skip
    done = make(
        "validate-judges", f"HUMANS={humans}", "POOL=gold single_offline", "VALIDATE_N=0",
        f"OUT={work / 'v'}", f"VALIDATE_OUT={work / 'validate'}", directory=root / "examples",
    )  # fmt: skip
    rows = [line for line in done.stdout.splitlines() if line.startswith("| gold ")]
    report(
        "recipes", "validate-judges, two pools, PandaLM file", done.returncode == 0 and len(rows) == 1,
        rc=done.returncode, stderr=done.stderr.strip()[-200:],
    )  # fmt: skip
    data = work / "instr.jsonl"
    data.write_text(
        "".join(
            json.dumps({"instruction": f"Write a line about topic {i}.", "output": f"Line {i}."})
            + "\n"
            for i in range(30)
        )
    )
    out = work / "demo"
    done = make(
        "SIZE=demo", f"DATA={data}", f"OUT={out}", "N_SFT=10", "N_PREF=6", "N_UNLABELED=6",
        "N_VAL=4", f"{out}/splits/.done", directory=root / "examples",
    )  # fmt: skip
    report(
        "recipes", "demo's split step at SIZE=demo", done.returncode == 0 and (out / "splits" / "val.jsonl").exists(),
        rc=done.returncode, stderr=done.stderr.strip()[-200:],
    )  # fmt: skip
    (work / "ckpts").mkdir()
    done = make(
        "-f", "examples/nightly.mk", f"CHECKPOINTS={work / 'ckpts'}", f"PROMPTS={data}",
        f"REFERENCE={data}", f"OUT={work / 'nightly'}",
    )  # fmt: skip
    report(
        "recipes", "nightly.mk from the project root, no checkpoint", done.returncode == 0,
        rc=done.returncode, stderr=done.stderr.strip()[-200:],
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------


def tiny_model(work: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from farmkit.lm.models import resolve

    folder = work / "tiny"
    tokenizer = AutoTokenizer.from_pretrained(resolve("embedded"))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(1)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def warmup(work: Path) -> None:
    import importlib

    import torch
    from click.testing import CliRunner
    from safetensors.torch import load_file
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    model = tiny_model(work)
    demos = work / "demos.jsonl"
    demos.write_text(
        "".join(
            json.dumps({"instruction": f"Spell the number {i}.", "output": f"{i} is spelled so."})
            + "\n"
            for i in range(6)
        )
    )
    prefs = work / "prefs.jsonl"
    prefs.write_text(
        "".join(
            json.dumps({"instruction": f"Greet person {i}.", "output_1": "Hello there!",
                        "output_2": "Go.", "preference": 1 if i % 3 else 2}) + "\n"
            for i in range(8)
        )
    )  # fmt: skip
    rates: list[float] = []
    hook = register_optimizer_step_pre_hook(lambda o, a, k: rates.append(o.param_groups[0]["lr"]))

    def run(name: str, *args: str) -> tuple[int, str]:
        module = importlib.import_module(f"farmkit.tools.{name.replace('-', '_')}")
        rates.clear()
        result = CliRunner().invoke(module.cli, [*args, "-q"])
        return result.exit_code, result.output[-300:]

    cases = [
        ("farm-sft", demos, ["--max-steps", "1", "--lr-scheduler", "linear", "--warmup-ratio", "0.1"]),
        ("farm-dpo", prefs, ["--max-steps", "2", "--warmup-ratio", "0.4", "--batch-size", "2"]),
        ("farm-rm-train", prefs, ["--max-steps", "40", "--batch-size", "2"]),
    ]  # fmt: skip
    for name, data, options in cases:
        out = work / f"out-{name}-{len(options)}"
        code, text = run(name, str(model), str(data), "-o", str(out), *options)
        first = rates[0] if rates else None
        report(
            "warmup", f"{name} {' '.join(options)}: step 1's learning rate",
            code == 0 and bool(first), first_rate=first, rc=code, output=text if code else "",
        )  # fmt: skip
    out = work / "sft-1"
    code, _ = run("farm-sft", str(model), str(demos), "-o", str(out), "--max-steps", "1",
                  "--learning-rate", "1e-3")  # fmt: skip
    before, after = (
        load_file(str(model / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    moved = sum(not torch.equal(after[k], before[k]) for k in after)
    report("warmup", "farm-sft --max-steps 1 (defaults) moves weights", code == 0 and moved > 0,
           tensors_changed=moved)  # fmt: skip
    for steps in (5, 25):
        out = work / f"sft-{steps}"
        code, _ = run("farm-sft", str(model), str(demos), "-o", str(out), "--max-steps", str(steps),
                      "--batch-size", "2")  # fmt: skip
        logged = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
        wanted = list(range(1, 6)) if steps == 5 else None
        ok = logged == wanted if wanted else (logged[-1] == steps and len(logged) >= 10)
        report(
            "warmup", f"farm-sft {steps} steps logs every step / the last", ok, steps_logged=logged
        )
    hook.remove()


# ---------------------------------------------------------------------------------------------


def plot() -> None:
    from farmkit import __version__

    for sub, flag in (("overopt", "-h"), ("curves", "--help"), ("history", "--help")):
        done, _ = tool("farm-plot", sub, flag)
        ok = done.returncode == 0 and done.stdout.startswith(f"Usage: farm-plot {sub}".encode())
        report("plot", f"farm-plot {sub} {flag} on stdout", ok, stdout=done.stdout[:40],
               stderr=done.stderr[:60])  # fmt: skip
    for sub in ("overopt", "curves"):
        done, _ = tool("farm-plot", sub, "--version")
        ok = done.returncode == 0 and done.stdout.decode().strip() == f"farm-plot {__version__}"
        report("plot", f"farm-plot {sub} --version", ok, stdout=done.stdout[:40],
               stderr=done.stderr[-80:])  # fmt: skip
    pager = subprocess.run(
        f"{BIN / 'farm-plot'} curves -h 2>/dev/null | head -1", shell=True, capture_output=True
    )
    report("plot", "farm-plot curves -h | head -1 shows the usage",
           pager.stdout.startswith(b"Usage: farm-plot curves"), stdout=pager.stdout[:40])  # fmt: skip


# ---------------------------------------------------------------------------------------------


def names(work: Path) -> None:
    prompts = work / "p.jsonl"
    prompts.write_text('{"instruction": "Hello?"}\n')
    outputs = work / "o.jsonl"
    outputs.write_text('{"instruction": "Hello?", "output": "Hi.", "generator": "g"}\n')
    cases = [
        ("farm-sample", "embeddded", {"HF_HUB_OFFLINE": "1"}, True),
        ("farm-score", "Embeded", {"HF_HUB_OFFLINE": "1"}, True),
        ("farm-sample", "emedded", {}, True),  # no offline flag: the case that took 53 s
        ("farm-sample", "someone/not-a-model", {"HF_HUB_OFFLINE": "1"}, False),
    ]
    for name, model, env, suggest in cases:
        data = outputs if name == "farm-score" else prompts
        done, took = tool(name, model, str(data), env=env, timeout=120)
        text = done.stderr.decode() if done else "(timed out)"
        ok = (
            done is not None
            and done.returncode == 1
            and took < 15
            and (("'embedded'" in text) if suggest else "offline" in text.lower() or "HF_HUB_OFFLINE" in text)
        )  # fmt: skip
        report("names", f"{name} {model} {env or ''}", ok, seconds=round(took, 1),
               message=text.strip().splitlines()[-1][-220:] if text.strip() else "")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--only", default="recipes,warmup,plot,names")
    args = parser.parse_args()
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="audit-use-") as scratch:
        work = Path(scratch)
        if "recipes" in only:
            (work / "r").mkdir()
            recipes(Path(args.root).resolve(), work / "r")
        if "plot" in only:
            plot()
        if "names" in only:
            (work / "n").mkdir()
            names(work / "n")
        if "warmup" in only:
            (work / "w").mkdir()
            warmup(work / "w")
    print(json.dumps({"ok": sum(results), "cases": len(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
