"""Annotator pools: YAML files (shipped in pools/ or given as a path) listing judges, the label-noise
rate, the model tiers and the request settings; loading, validation and the `--list-pools` rows.

A pool file:

    name: sim_eval
    description: one line
    flip_rate: 0.0            # share of labels flipped by noise (see below)
    tiers: {small: gpt-4o-mini, medium: gpt-4.1-mini, large: gpt-4.1}
    settings: {concurrency: 16, timeout: 60, connect_timeout: 10, max_retries: 6, backoff: 1.0, parse_retries: 2}
    prices: {my-model: {prompt: 0.5, completion: 1.5}}   # USD per million tokens, optional
    judges:
      - {name: plain-large, backend: openai, tier: large, prompt: plain, batch_size: 1, temperature: 1.0}

`flip_rate` is the share of labels that end up flipped: each label is replaced by a fair coin with
probability 2 * flip_rate, so 0.25 means half the labels are coin flips (AlpacaFarm's setting).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farmkit.core.endpoint import DEFAULT_MAX_REPLY, LONG_WAIT, MAX_WAIT
from farmkit.core.fields import EXISTING_FILE, help_field
from farmkit.core.io import FarmError, MissingInput
from farmkit.core.values import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Bounds, Number

DEFAULT_SETTINGS = {
    "concurrency": 16,
    "timeout": 60.0,
    "connect_timeout": 10.0,  # seconds to open a connection; none before the endpoint ever answered stops the run
    "max_retries": 6,
    "backoff": 1.0,
    "parse_retries": 2,
    "max_reply_bytes": DEFAULT_MAX_REPLY,  # a longer reply is not read: the pair gets no verdict
}
# The kind and range of each number a pool file holds (farmkit.core.values): farm-annotate's flags
# that override them (--flip-rate, --concurrency, --timeout, --max-retries) are declared with these.
FLIP_RATE = Number(float, Bounds(0, 0.5))  # 0.5: every label a coin flip
SETTINGS = {
    "concurrency": Number(int, AT_LEAST_ONE),
    "timeout": Number(float, Bounds(min=0.1)),
    "connect_timeout": Number(float, Bounds(min=0.1)),
    "max_retries": Number(int, NON_NEGATIVE),
    "backoff": Number(float, NON_NEGATIVE),
    "parse_retries": Number(int, NON_NEGATIVE),
    "max_reply_bytes": Number(int, Bounds(min=1024)),
}
JUDGE_NUMBERS = {
    "weight": Number(float, POSITIVE),
    "temperature": Number(float, NON_NEGATIVE),
    "batch_size": Number(int, Bounds(1, 16)),
    "examples": Number(int, NON_NEGATIVE),
    "max_tokens": Number(int, AT_LEAST_ONE),
    "top_logprobs": Number(int, NON_NEGATIVE),
    "length_bias": Number(float),
    "position_bias": Number(float),
}


@dataclass
class AnnotateConfig:
    """farm-annotate's own settings: the pool (or labels) asked, how it is asked, and what the
    outputs read are (its seed, judge and device options are the shared ones)."""

    pool: str | None = help_field(
        None,
        "A pool name (see --list-pools), a pool YAML file, or a learned judge folder (farm-judge-train; judged by it alone, no flips).  [default: sim_ann; with --reference: sim_eval, "
        "the noise-free evaluation pool]",
        show_default=False,
    )
    generators: tuple[str, ...] = help_field(
        (),
        "The system that wrote output records without a `generator` field (AlpacaFarm's published "
        "outputs have none): one name for every input file, or one per file in order; repeatable. "
        "Default: the file's name (rlhf_ppo.jsonl.gz -> rlhf_ppo), said on stderr.",
        flags=("--generator",),
        multiple=True,
        metavar="NAME",
        show_default=False,
    )
    skip_missing: bool = help_field(
        False,
        "With --reference: leave out output records whose instruction the reference lacks "
        "(counted on stderr) instead of stopping.",
        flag=True,
        show_default=False,
    )
    labels: str | None = help_field(
        None,
        "Take verdicts from this preference file (human labels) instead of a pool.",
        path=EXISTING_FILE,
        show_default=False,
    )
    assign_by: str = help_field(
        "item",
        "What draws the judge and the order shown: each pair, or the instruction (every model meets the same "
        "judge and order on an instruction, which lowers the variance of comparisons between models).",
        ("item", "instruction"),
    )
    estimate: bool = help_field(
        False,
        "Print the expected requests, tokens and price as JSON and exit without asking anything.",
        flag=True,
        show_default=False,
    )
    concurrency: int | None = help_field(
        None,
        "The most requests in flight at once, fewer while the endpoint is slow (pool default: 16).",
        bounds=SETTINGS["concurrency"].bounds,
        show_default=False,
    )
    timeout: float | None = help_field(
        None,
        "Seconds before a request is abandoned and retried (pool default: 60).",
        bounds=SETTINGS["timeout"].bounds,
        show_default=False,
    )
    max_retries: int | None = help_field(
        None,
        "Retries of a failed request (pool default: 6). A wait the endpoint asks for (Retry-After, a "
        f"rate limit's x-ratelimit-reset-*) lasts at most {MAX_WAIT / 60:.0f} minutes, and any wait "
        f"over {LONG_WAIT:.0f} s is said on stderr.",
        bounds=SETTINGS["max_retries"].bounds,
        show_default=False,
    )
    max_reply_bytes: int | None = help_field(
        None,
        "The largest reply read from an endpoint, in bytes: a larger one is not read and its pairs get no "
        f"verdict, with the reason (pool default: {DEFAULT_MAX_REPLY:,}).",
        bounds=SETTINGS["max_reply_bytes"].bounds,
        show_default=False,
    )
    retry_failed: bool = help_field(
        False,
        "Ask again the pairs whose cached reply could not be read. By default such a reply is re-read "
        "from the cache for free, and asked again only when a newer parser still cannot read it.",
        flag=True,
        show_default=False,
    )
    progress: bool = help_field(
        False,
        "Show the progress bar (cache hits, requests, failures, spend) on stderr even "
        "when stderr is not a terminal; -q silences it.",
        flag=True,
        show_default=False,
    )
    list_pools: bool = help_field(
        False, "Print every shipped pool as JSON lines and exit.", flag=True, show_default=False
    )


def checked(declared: Number, value: Any, where: str) -> int | float:
    """A pool file's number, or FarmError naming where it is and what it must be."""
    try:
        return declared.check(value)
    except ValueError as exc:
        raise FarmError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Judge:
    """One simulated annotator. `temperature` is how random its verdicts are: the decoding temperature
    for openai/local judges, the Bradley-Terry temperature for oracle judges (0: deterministic)."""

    name: str
    backend: str
    weight: float = 1.0
    temperature: float = 0.0
    # openai and local: which model, which prompt, how many pairs per request, worked examples
    tier: str | None = None
    model: str | None = None
    prompt: str = "plain"
    batch_size: int = 1
    examples: int = 0
    max_tokens: int = 300
    # openai: ask for this many likeliest first tokens and weigh the verdict by their probabilities
    # (a fractional preference; one pair per request, a `choice` template); 0: a parsed hard verdict
    top_logprobs: int = 0
    dtype: str = (
        "auto"  # local: the judge model's weights (auto: bf16 on a GPU that has it, else fp32)
    )
    # oracle: the "true" reward ("heuristic" or a reward model folder) and the biases added to it
    reward: str = "heuristic"
    length_bias: float = 0.0
    position_bias: float = 0.0
    # file: where the labels are and how several labels for one pair are combined
    path: str | None = None
    aggregate: str = "sample"

    def key_fields(self) -> dict[str, Any]:
        """The judge's settings that can change a verdict. The caller adds what they resolve to (the model, the
        template's text, the endpoint, the device), so neither a prompt file's path nor a tier name is in it."""
        fields = dataclasses.asdict(self)
        for unused in ("name", "weight", "tier", "model", "prompt", "dtype"):
            fields.pop(unused)
        if not self.top_logprobs:  # added later: the judges that do not weigh keep their cache keys
            fields.pop("top_logprobs")
        return fields


@dataclass
class Pool:
    name: str
    description: str
    judges: list[Judge]
    flip_rate: float = 0.0
    tiers: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SETTINGS))
    prices: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = ""

    @property
    def backends(self) -> list[str]:
        return sorted({judge.backend for judge in self.judges})

    def model_for(self, judge: Judge) -> str | None:
        """The concrete model a judge calls: its own `model`, else its tier's model."""
        if judge.model:
            return judge.model
        if judge.tier is None:
            return None
        if judge.tier not in self.tiers:
            raise FarmError(
                f"pool {self.name}: judge {judge.name} uses tier {judge.tier!r}, which the pool does not map to a model"
            )
        return self.tiers[judge.tier]

    def with_models(self, overrides: list[str]) -> Pool:
        """Apply `--model NAME` (every openai judge) first, then `--model TIER=NAME` (that tier's judges)."""
        tiers, judges = dict(self.tiers), list(self.judges)
        for name in [o for o in overrides if "=" not in o]:
            tiers = dict.fromkeys(tiers, name)
            judges = [
                dataclasses.replace(j, model=name) if _asks_endpoint(j.backend) else j
                for j in judges
            ]
        for override in [o for o in overrides if "=" in o]:
            tier, name = override.split("=", 1)
            if tier not in tiers:
                raise FarmError(
                    f"--model {override}: pool {self.name} has no tier {tier!r} (tiers: {', '.join(sorted(tiers)) or 'none'})"
                )
            tiers[tier] = name
            judges = [dataclasses.replace(j, model=None) if j.tier == tier else j for j in judges]
        return dataclasses.replace(self, tiers=tiers, judges=judges)

    def listing(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backends": self.backends,
            "judges": len(self.judges),
            "flip_rate": self.flip_rate,
            "needs_endpoint": any(_asks_endpoint(name) for name in self.backends),
            "description": self.description,
        }


def _asks_endpoint(backend: str) -> bool:
    from farmkit.annotate.backends import backend_class

    return backend_class(backend).needs_endpoint


def _folder():
    return importlib.resources.files("farmkit.annotate").joinpath("pools")


def shipped_pools() -> list[str]:
    return sorted(entry.name[:-5] for entry in _folder().iterdir() if entry.name.endswith(".yaml"))


def load_pool(name_or_path: str) -> Pool:
    """A shipped pool by name, or a pool YAML file."""
    import yaml

    from farmkit.core.yamltext import safe_yaml

    shipped = _folder().joinpath(f"{name_or_path}.yaml")
    if shipped.is_file():
        text, source, base = shipped.read_text(encoding="utf-8"), f"pools/{name_or_path}.yaml", None
    else:
        path = Path(name_or_path)
        if path.is_dir() and _is_learned_judge(path):
            return learned_judge_pool(path)
        if not path.is_file():
            # an input that is not there: a usage error (exit 2), as every missing input is
            looks_like_a_file = os.sep in name_or_path or path.suffix in (".yaml", ".yml")
            missing = (
                f"{name_or_path}: no such file"
                if looks_like_a_file and not path.exists()
                else f"not a shipped pool ({', '.join(shipped_pools())}) nor a YAML file"
            )
            raise MissingInput(
                f"no pool {name_or_path!r}: {missing}; see farm-annotate --list-pools"
            )
        text, source, base = path.read_text(encoding="utf-8"), str(path), path.parent
    try:
        data = safe_yaml(text)
    except yaml.YAMLError as exc:
        raise FarmError(f"{source}: not valid YAML ({exc})") from None
    return pool_from_dict(data, source, base)


def _is_learned_judge(folder: Path) -> bool:
    import json

    meta = folder / "meta.json"
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text(encoding="utf-8")).get("kind") == "learned_judge"
    except ValueError:
        return False


def learned_judge_pool(folder: Path) -> Pool:
    """A learned judge's folder (farm-judge-train -o FOLDER) used as a pool: one deterministic oracle
    judge that reads it, no flips. So `--pool FOLDER` and `--gold FOLDER` work as the shipped `gold`
    pool does for the shipped gpt4 judge."""
    resolved = folder.resolve()
    return pool_from_dict(
        {
            "name": resolved.name,
            "description": f"the learned judge in {resolved} (farm-judge-train), deterministic",
            "flip_rate": 0.0,
            "judges": [
                {
                    "name": resolved.name,
                    "backend": "oracle",
                    "reward": str(resolved),
                    "temperature": 0.0,
                }
            ],
        },
        str(folder),
    )


def pool_from_dict(data: Any, source: str, base: Path | None = None) -> Pool:
    if not isinstance(data, dict):
        raise FarmError(f"{source}: expected a mapping with name, description and judges")
    known = {"name", "description", "flip_rate", "tiers", "settings", "prices", "judges"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise FarmError(
            f"{source}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(known))}"
        )
    judges_data = data.get("judges")
    if not isinstance(judges_data, list) or not judges_data:
        raise FarmError(f"{source}: `judges` must be a non-empty list")
    judge_fields = {f.name for f in dataclasses.fields(Judge)}
    judges = []
    for number, entry in enumerate(judges_data, start=1):
        if not isinstance(entry, dict):
            raise FarmError(f"{source}: judge {number} is not a mapping")
        bad = sorted(set(entry) - judge_fields)
        if bad:
            raise FarmError(
                f"{source}: judge {number}: unknown key(s) {', '.join(bad)}; expected some of {', '.join(sorted(judge_fields))}"
            )
        entry = dict(entry)
        for key in set(entry) & set(JUDGE_NUMBERS):
            entry[key] = checked(JUDGE_NUMBERS[key], entry[key], f"{source}: judge {number}: {key}")
        entry.setdefault("name", f"judge{number}")
        if entry.get("path") and base is not None and not Path(entry["path"]).is_absolute():
            entry["path"] = str(base / entry["path"])
        if entry.get("prompt") and base is not None and (base / entry["prompt"]).is_file():
            entry["prompt"] = str(base / entry["prompt"])
        try:
            judge = Judge(**entry)
        except TypeError as exc:
            raise FarmError(f"{source}: judge {number}: {exc}") from None
        _check_judge(judge, source)
        judges.append(judge)
    names = [judge.name for judge in judges]
    if len(set(names)) != len(names):
        raise FarmError(f"{source}: judge names must be unique")
    flip_rate = checked(FLIP_RATE, data.get("flip_rate", 0.0), f"{source}: flip_rate")
    settings = dict(DEFAULT_SETTINGS)
    settings.update(data.get("settings") or {})
    unknown_settings = sorted(set(settings) - set(DEFAULT_SETTINGS))
    if unknown_settings:
        raise FarmError(
            f"{source}: unknown setting(s) {', '.join(unknown_settings)}; expected {', '.join(DEFAULT_SETTINGS)}"
        )
    for key, declared in SETTINGS.items():
        settings[key] = checked(declared, settings[key], f"{source}: settings: {key}")
    return Pool(
        name=str(data.get("name") or Path(source).stem),
        description=str(data.get("description", "")),
        judges=judges,
        flip_rate=flip_rate,
        tiers=dict(data.get("tiers") or {}),
        settings=settings,
        prices=dict(data.get("prices") or {}),
        source=source,
    )


def _check_judge(judge: Judge, source: str) -> None:
    where = f"{source}: judge {judge.name}"
    from farmkit.annotate.backends import REGISTRY, backend_class

    if judge.backend not in REGISTRY:
        raise FarmError(
            f"{where}: unknown backend {judge.backend!r}; expected one of {', '.join(REGISTRY)}"
        )
    problem = backend_class(judge.backend).check(judge)
    if problem:
        raise FarmError(f"{where}: {problem}")
    if judge.examples:
        from farmkit.annotate.prompts import worked_examples

        if not 0 <= judge.examples <= len(worked_examples()):
            raise FarmError(
                f"{where}: examples must be between 0 and {len(worked_examples())} (the worked examples shipped)"
            )
    if judge.dtype not in ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"):
        raise FarmError(f"{where}: dtype must be auto, float32, bfloat16 or float16")
    if judge.aggregate not in ("sample", "mean"):
        raise FarmError(f"{where}: aggregate must be sample or mean")


def labels_pool(path: str) -> Pool:
    """A pool of one `file` judge over published verdicts (AlpacaEval annotations, preference records
    with both texts): the pair's label, its mean when labelled several times, fractions kept."""
    return pool_from_dict(
        {
            "name": "labels",
            "description": f"verdicts read from {path}",
            "judges": [{"name": "file", "backend": "file", "path": path, "aggregate": "mean"}],
        },
        "--labels",
    )
