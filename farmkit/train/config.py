"""Method configurations as dataclasses whose fields carry their help text. farmkit.cli turns them
into click options (`config_options`) and reads them from `--config x.yaml`: defaults < YAML file <
flags given on the command line (`resolve_config`).

Every method config inherits `ModelArgs` (the prompt template and the seed). The help texts of the
concepts several tools share (SHARED_HELP) are written once here; farmkit.cli's option bundles use
the same texts, so farm-sft's --seed reads like farm-sample's.

No click and no torch here: the methods import this and `--help` must stay fast.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from farmkit.core.fields import (
    check_fields,
    concept,
    field_values,
    help_field,
)
from farmkit.core.values import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    UNBOUNDED,
    Bounds,
    Number,
)
from farmkit.lm.generation import COMPILE_GENERATION_HELP, DECODING_NUMBERS
from farmkit.lm.models import TEMPLATES
from farmkit.train.estimators import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_KINDS,
    POLICY_LOSSES,
    check_fit,
    names_of,
    policy_loss,
)
from farmkit.train.precision import PRECISIONS

# ---------------------------------------------------------------------------------------------
# One help text per concept shared by several tools (the CLI dialect; tests/test_cli.py).

SHARED_HELP = {
    "seed": "Seed for every random choice (sampling, shuffling, label noise, the order shown to a judge): the same input and seed make the same choices.",
    "num_samples": "Samples per prompt.",
    "lr_scheduler_type": "How the learning rate changes over the run (transformers' "
    "lr_scheduler_type).",
    "save_steps": "Write a checkpoint every this many steps (0: none).",
    "resume": "Continue an interrupted run from what it saved instead of starting over.",
    "template": "Prompt template: auto (the one the model folder records, else its chat template, "
    "else alpaca), chat or alpaca.",
    "device": "auto (a GPU if present, else the CPU), cpu, cuda, cuda:1...; under accelerate "
    "launch leave it auto (each process uses its own).",
    "precision": "Training arithmetic: fp32, or bf16 autocast over float32 weights, optimizer "
    "state and loss; auto: bf16 on a GPU that supports it and on a CPU with native bf16 "
    "(avx512_bf16 or amx_bf16 in /proc/cpuinfo), else fp32 (env FARMKIT_PRECISION sets auto's "
    "choice). A CPU samples rollouts in float32 either way. meta.json's launch.mixed_precision "
    "records it.",
    "temperature": "Sampling temperature; 0 decodes greedily where the tool allows it (best-of-n "
    "and the trainers need > 0: their log-probabilities, and so their KL to the SFT model, are "
    "those of the tempered distribution). AlpacaFarm: 1 for training and pairs to annotate, 0.7 "
    "for evaluation.",
    "top_p": "Nucleus sampling: sample from the most likely tokens that hold this probability "
    "mass (1: off).",
    "max_new_tokens": "Longest response generated, in tokens (AlpacaFarm: 300).",
    "generation_batch_size": "Sequences generated per forward pass (with n samples per prompt, "
    "prompts per pass = this / n); results depend on it with transformers.",
    "reward_batch_size": "Texts per reward-model forward pass.",
    "epochs": "Passes over the training data.",
    "max_steps": "Stop after this many optimizer steps (overrides --epochs; -1: no limit).",
    "learning_rate": "Peak learning rate (AdamW; LoRA wants about 10 to 100 times more).",
    "gradient_accumulation_steps": "Forward passes per optimizer step (effective batch = batch "
    "size x this x processes).",
    "warmup_ratio": "Fraction of the steps spent warming the learning rate up.",
    "weight_decay": "AdamW weight decay.",
    "lora": "Train LoRA adapters (peft) instead of every weight; they are merged before saving.",
    "lora_rank": "LoRA rank r: the inner dimension of each adapter.",
    "lora_alpha": "LoRA scaling numerator (alpha / rank scales the adapter).",
    "report_to": "Also send the training metrics to an experiment tracker: tensorboard (event "
    "files in DIR.runs/ beside the output folder), wandb (set up by its own variables: "
    "WANDB_PROJECT, WANDB_MODE...) or none.",
    "gold": "Also score every checkpoint (farm-bon: every n) with a gold judge: a reward model folder, or an annotator "
    "pool (a farm-annotate --pool name or YAML file, e.g. the offline gold pool, or a learned judge "
    "folder from farm-judge-train), judging one "
    "answer per gold prompt against the starting model's answer. metrics.jsonl gets gold_win_rate "
    "(percent) and its standard error gold_win_rate_se, gold_reward (a reward model's mean score), gold_kl and gold_answer_length; "
    "meta.json what judging cost.",
    "gold_prompts": "Instruction records the gold judge evaluates on (the first --gold-size). "
    "Default: the first --gold-size distinct prompts of the training input.",
    "gold_size": "Prompts the gold judge evaluates on.",
    "rollout_backend": "What samples the policy's answers: hf (transformers' generate), vllm (a "
    "vLLM engine in the training process; pip install 'farmkit[gpu]'), or auto (vllm when it is "
    "installed and a GPU is present, else hf).",
    # the annotator options of the tools that ask farm-annotate's pools (farm-annotate, farm-online-dpo)
    "flip_rate": "Share of labels flipped by noise (overrides the pool's; sim_ann: 0.25).",
    "both_orders": "Ask in both orders; verdicts that disagree become a tie (1.5).",
    "judge_models": "Model for every openai judge (NAME) or for one tier (TIER=NAME); repeatable.",
    "cache": "SQLite verdict cache; any number of runs may share one at once (a question another "
    "run is asking is waited for, not paid twice)  [default: FARMKIT_CACHE/annotations.sqlite].",
    "no_cache": "Neither read nor write the verdict cache.",
    "max_cost": "Budget in USD. Refuses a model without a known price (give one with --prices); each "
    "request in flight holds its worst case (max_tokens, and the prompt at the densest billing "
    "seen), so concurrent requests cannot overshoot the cap.",
    # the human labels of farm-audit, farm-winrate and farm-correlate (farm-label's screening)
    "include_screened": "With --humans: count the labels of annotators screened out by their check "
    "answers too (farm-label --min-check-score marks them screened_out: true); left out by default, "
    "and said on stderr.",
    "prices": "YAML price table: MODEL: {prompt: USD/1M, completion: USD/1M} (and batch: the share of it a "
    "Batch API bills, default 0.5).",
}

# The kind and range of every numeric concept several tools share: the options (farmkit.cli.SHARED)
# and the config fields (shared_field) take them from here, so a flag and a --config key are checked
# alike (farmkit.core.values).
SHARED_NUMBERS = {
    # numpy's seeding (transformers' set_seed, the bootstrap's generators) takes 32 bits, no sign
    "seed": Number(int, Bounds(0, 2**32 - 1)),
    "num_samples": DECODING_NUMBERS["n"],
    "temperature": DECODING_NUMBERS["temperature"],
    "top_p": DECODING_NUMBERS["top_p"],
    "max_new_tokens": DECODING_NUMBERS["max_new_tokens"],
    "generation_batch_size": DECODING_NUMBERS["batch_size"],
    "reward_batch_size": Number(int, AT_LEAST_ONE),
    "epochs": Number(int, AT_LEAST_ONE),
    "max_steps": Number(int, Bounds(min=-1)),
    "learning_rate": Number(float, POSITIVE),
    "gradient_accumulation_steps": Number(int, AT_LEAST_ONE),
    "warmup_ratio": Number(float, Bounds(0, 1, max_open=True)),
    "weight_decay": Number(float, NON_NEGATIVE),
    "save_steps": Number(int, NON_NEGATIVE),
    "lora_rank": Number(int, AT_LEAST_ONE),
    "lora_alpha": Number(int, AT_LEAST_ONE),
    "gold_size": Number(int, AT_LEAST_ONE),
    "max_cost": Number(float, POSITIVE),
}

REPORT_TO = ("none", "tensorboard", "wandb")
ROLLOUT_BACKENDS = ("auto", "hf", "vllm")


def shared_field(
    name: str, default: Any, choices: tuple[str, ...] | None = None, more_help: str = ""
) -> Any:
    """A field of a concept several tools share: its help is SHARED_HELP[name], then `more_help`
    (what this method does with the value). The field may keep another name than the concept's
    (QuarkConfig.samples_per_prompt is --num-samples): its option and --config key are the
    concept's, the old name a hidden alias."""
    help_text = f"{SHARED_HELP[name]} {more_help}" if more_help else SHARED_HELP[name]
    bounds = SHARED_NUMBERS[name].bounds if name in SHARED_NUMBERS else UNBOUNDED
    return help_field(default, help_text, choices, bounds, shared=name, more_help=more_help)


@dataclasses.dataclass
class ModelArgs:
    """What every method config has: how prompts are formatted for the model, and the seed."""

    template: str = shared_field("template", "auto", TEMPLATES)
    seed: int = shared_field("seed", 0)

    def __post_init__(self) -> None:
        # every method config is one of these: its numbers are checked before its own checks
        check_fields(self)


@dataclasses.dataclass
class TrackingArgs:
    """Where a trainer reports its metrics besides metrics.jsonl and stderr."""

    report_to: str = shared_field("report_to", "none", REPORT_TO)


@dataclasses.dataclass
class GoldArgs:
    """--gold: a second judge that scores every checkpoint (farmkit.train.gold)."""

    gold: str | None = shared_field("gold", None)
    gold_prompts: str | None = shared_field("gold_prompts", None)
    gold_size: int = shared_field("gold_size", 32)


# Old option names kept for one release (hidden from --help, a warning on stderr when used), and
# the old keys of --config files, by the field they now set.
RENAMED_FIELDS = {"lora_r": "lora_rank", "max_response_tokens": "max_new_tokens"}


# ---------------------------------------------------------------------------------------------
# What the policy-gradient methods (farm-ppo, farm-quark, and those to come) share: the rollout.

UNFINISHED = ("truncate", "penalty")
# --rollout-correction (farmkit.train.rollout_backends.rollout_correction)
CORRECTION_MODES = ("token-truncate", "token-mask", "sequence-truncate", "sequence-mask")
OVERLONG = ("none", "penalty", "filter")
# --async-rollouts' cap of the correction when none is given (TRL's vllm_importance_sampling_cap)
ASYNC_CAP = 3.0
KL_ESTIMATORS = ("k1", "clamped", "k3")


@dataclasses.dataclass
class RolloutConfig(ModelArgs):
    """Settings of the rollout that PPO and Quark share: one name, default and help for both tools."""

    temperature: float = shared_field("temperature", 1.0)
    max_new_tokens: int = shared_field("max_new_tokens", 300)
    unfinished: str = help_field(
        "truncate",
        "A response that hits max-new-tokens without its end token: 'truncate' (AlpacaFarm's "
        "default) scores the truncated text as it is; 'penalty' replaces its score with "
        "unfinished-penalty.",
        UNFINISHED,
    )
    unfinished_penalty: float = help_field(
        -1.0,
        "The score given to an unfinished response under --unfinished penalty (AlpacaFarm: -1).",
    )
    reward_batch_size: int = shared_field("reward_batch_size", 16)
    adam_eps: float = help_field(
        1e-5,
        "Epsilon of AdamW (AlpacaFarm: 1e-5, from OpenAI's PPO and Quark's code; torch's default "
        "is 1e-8).",
        bounds=POSITIVE,
    )
    warmup_steps: int = help_field(
        0,
        "Steps (PPO) or rounds (Quark) over which the learning rate rises linearly from 0 "
        "(AlpacaFarm: 5).",
        bounds=NON_NEGATIVE,
    )
    max_grad_norm: float = help_field(
        1.0, "Gradient clipping: largest total gradient norm (AlpacaFarm: 1).", bounds=POSITIVE
    )
    # vllm: the policy's weights are pushed into the engine before each rollout
    rollout_backend: str = shared_field("rollout_backend", "auto", ROLLOUT_BACKENDS)
    compile_generation: bool = help_field(False, COMPILE_GENERATION_HELP)
    vllm_gpu_memory_utilization: float = help_field(
        0.3,
        "With --rollout-backend vllm on a GPU: the share of the GPU's memory the colocated engine "
        "may take (weights and KV cache); training keeps the rest.",
        bounds=Bounds(0, 1, min_open=True),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # the shared range of --temperature allows 0 (greedy decoding), which a trainer cannot use
        if self.temperature == 0:
            raise ValueError("temperature must be positive")


def _by_kind(registry: dict[str, Any]) -> str:
    """The registered names of each kind of advantages, a sentence each."""
    return " ".join(
        f"{description[0].upper()}{description[1:]}: {names_of(registry, kind)}."
        for kind, description in ADVANTAGE_KINDS.items()
    )


def advantage_estimator_field(default: str | None) -> Any:
    """--advantage-estimator, with the method's default: every name of the registry
    (farmkit.train.estimators) is a choice; one of another kind is refused by check_fit."""
    return help_field(
        default,
        "How a step's scores become advantages: an estimator registered in "
        f"farmkit.train.estimators (docs/methods.md). {_by_kind(ADVANTAGE_ESTIMATORS)}",
        tuple(ADVANTAGE_ESTIMATORS),
    )


def policy_loss_field(default: str | None) -> Any:
    """--policy-loss, with the method's default, as advantage_estimator_field."""
    return help_field(
        default,
        "How PPO's clipped surrogate is aggregated over tokens and responses into the loss: a "
        f"loss registered in farmkit.train.estimators (docs/methods.md). {_by_kind(POLICY_LOSSES)}",
        tuple(POLICY_LOSSES),
    )


@dataclasses.dataclass
class OnPolicyConfig(RolloutConfig, TrackingArgs, GoldArgs):
    """What the methods of the one on-policy trainer (farm-ppo, farm-rloo, farm-grpo;
    farmkit.train.onpolicy) share: steps of one rollout batch and `ppo-epochs` passes over it in
    minibatches of micro-batches, checkpoints, --resume and LoRA. Each method words the batch sizes
    its own way (prompts or responses) and sets its own KL coefficient, and its own defaults of
    the advantage estimator and the policy loss, of the kind of advantages it makes."""

    tool: ClassVar[str] = ""
    advantage_kind: ClassVar[str] = ""  # farmkit.train.estimators.TOKEN or RESPONSE

    steps: int = help_field(
        100,
        "Steps: each samples one rollout batch and trains `ppo-epochs` passes over it.",
        bounds=AT_LEAST_ONE,
    )
    rollout_batch_size: int = help_field(
        64, "Rollouts sampled per step, over all processes.", bounds=AT_LEAST_ONE
    )
    minibatch_size: int = help_field(
        16, "Rollouts per optimizer step, over all processes.", bounds=AT_LEAST_ONE
    )
    micro_batch_size: int = help_field(
        4,
        "Rollouts per forward/backward pass on one process; gradients accumulate up to a minibatch. Lower it to save memory.",
        bounds=AT_LEAST_ONE,
    )
    ppo_epochs: int = help_field(2, "Passes over each rollout batch.", bounds=AT_LEAST_ONE)
    learning_rate: float = help_field(
        1e-5, "Peak learning rate (AdamW); decays linearly to 0 by the last step.", bounds=POSITIVE
    )
    kl_coef: float = help_field(
        0.05, "Coefficient of the KL penalty to the SFT model.", bounds=NON_NEGATIVE
    )
    clip_range: float = help_field(
        0.2, "Clipping of the probability ratio: 1 +/- this.", bounds=POSITIVE
    )
    checkpoint_every: int = shared_field(
        "save_steps",
        20,
        more_help="Each is a loadable policy folder (step-N/ in the checkpoint folder). "
        "Performance often peaks early, then over-optimization sets in.",
    )
    checkpoint_dir: str | None = help_field(
        None,
        "Folder of checkpoints and metrics.jsonl. Default: OUTPUT-checkpoints beside the output.",
    )
    resume: bool = shared_field(
        "resume",
        False,
        more_help="From the newest complete checkpoint in the checkpoint folder; with none (killed "
        "before its first save), the run starts from the beginning.",
    )
    device: str = shared_field("device", "auto")
    precision: str = shared_field("precision", "auto", PRECISIONS)
    # LoRA adapters (on the policy, and PPO's value model); the KL reference is the policy without them
    lora: bool = shared_field("lora", False)
    lora_rank: int = shared_field("lora_rank", 16)
    lora_alpha: int = shared_field("lora_alpha", 32)
    clip_range_low: float | None = help_field(
        None,
        "Lower clipping of the probability ratio: 1 - this. Default: --clip-range, or the policy "
        "loss's own range (gspo: 3e-4).",
        bounds=POSITIVE,
        show_default=False,
    )
    clip_range_high: float | None = help_field(
        None,
        "Upper clipping of the probability ratio: 1 + this (DAPO's clip-higher: 0.28 against 0.2 "
        "below; cispo caps its weight at 1 + this). Default: as --clip-range-low.",
        bounds=POSITIVE,
        show_default=False,
    )
    importance_sampling_cap: float = help_field(
        0.0,
        "The cap of the rollout correction (--rollout-correction) of the rollout engine's "
        "mismatch (vllm): pi_trainer / pi_engine of the sampled token, or of the whole response. "
        "0: off (TRL caps at 3, verl at 2). With the hf backend, where the policy samples itself, "
        "there is no mismatch: it does nothing, and a warning says so (unless --async-rollouts, "
        "whose stale batches it corrects).",
        bounds=NON_NEGATIVE,
    )
    rollout_correction: str | None = help_field(
        None,
        "With --importance-sampling-cap: each token's loss weighted by its own ratio (token-*) or "
        "by its response's (sequence-*: the product over its tokens), a ratio above the cap capped "
        "(*-truncate) or its weight set to 0 (*-mask). metrics.jsonl gets the share truncated or "
        "masked and the engine-vs-trainer KL. Default: token-truncate, or sequence-truncate for a "
        "loss with one ratio per response (sequence-ratio, gspo, luspo), which takes only "
        "sequence-*; vespo takes the weights into its response's ratio, not onto its terms.",
        CORRECTION_MODES,
        show_default=False,
    )
    off_policy_mask_threshold: float | None = help_field(
        None,
        "Drop from the loss a response with a negative advantage whose mean per-token log "
        "pi_sampling - log pi (the engine's, or the sampling policy's, against the policy being "
        "trained) exceeds this (DeepSeek-V3.2's off-policy sequence mask; TRL's "
        "off_policy_mask_threshold, e.g. 0.5). Default: off.",
        bounds=POSITIVE,
        show_default=False,
    )
    async_rollouts: bool = help_field(
        False,
        "One-step off-policy rollouts: the next step's batch is sampled (by a copy of the policy "
        "as of the step it starts at, or the vllm engine given those weights, in a thread) while "
        "the current one trains, so a batch is "
        "at most --max-staleness steps old when it trains. metrics.jsonl gets each step's "
        "staleness; the sampling weights' log-probabilities correct it through the rollout "
        "correction (--rollout-correction; an --importance-sampling-cap of 0 becomes 3). Not "
        "with --dynamic-sampling or ZeRO-3 (nor, with the vllm rollout backend, with "
        "--top-p/--top-k).",
    )
    max_staleness: int = help_field(
        1,
        "With --async-rollouts: how many steps (each a batch and its updates) the weights that "
        "sample a batch may lag the policy it trains (0: no overlap, the synchronous run "
        "exactly; K: K copies of the policy at most).",
        bounds=NON_NEGATIVE,
    )
    overlong: str = help_field(
        "none",
        "Responses cut at max-new-tokens: 'penalty' adds DAPO's soft overlong punishment to the "
        "score (0 up to max-new-tokens - overlong-cache tokens, then falling linearly to -1 at "
        "max-new-tokens); 'filter' leaves unfinished responses out of the loss.",
        OVERLONG,
    )
    overlong_cache: int = help_field(
        64,
        "The last tokens before max-new-tokens over which --overlong penalty falls (DAPO: 4096 "
        "of 20480).",
        bounds=AT_LEAST_ONE,
    )
    top_p: float = shared_field("top_p", 1.0)
    top_k: int = help_field(
        0,
        "Top-k sampling: sample from the k most likely tokens (0: off; with --top-p, top-k "
        "first). A truncated rollout is replayed in training: every log-probability (the ratio, "
        "the rollout correction, the KL) is renormalised over the tokens the sampler kept "
        "(docs/methods.md).",
        bounds=NON_NEGATIVE,
    )
    advantage_estimator: str | None = advantage_estimator_field(None)
    policy_loss: str | None = policy_loss_field(None)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_rollout()
        if self.rollout_batch_size % self.minibatch_size:
            raise ValueError("rollout-batch-size must be a multiple of minibatch-size")
        check_fit(self.tool, self.advantage_kind, self.advantage_estimator, self.policy_loss)
        loss = policy_loss(self.policy_loss)
        low, high = loss.clip or (self.clip_range, self.clip_range)
        if self.clip_range_low is None:
            self.clip_range_low = low
        if self.clip_range_high is None:
            self.clip_range_high = self.clip_range_low if loss.clip is None else high
        if self.rollout_correction is None:
            level = "sequence" if loss.per_response_weights else "token"
            self.rollout_correction = f"{level}-truncate"
        elif loss.per_response_weights and self.rollout_correction.startswith("token"):
            raise ValueError(
                f"--rollout-correction {self.rollout_correction}: --policy-loss {self.policy_loss} "
                "has one ratio per response, so it takes sequence-truncate or sequence-mask"
            )
        if self.async_rollouts:
            if getattr(self, "dynamic_sampling", False):
                raise ValueError(
                    "--async-rollouts and --dynamic-sampling do not go together: the extra draws "
                    "would be sampled by the current weights beside a batch sampled by older ones"
                )
            if not self.importance_sampling_cap:
                self.importance_sampling_cap = ASYNC_CAP
        if self.overlong == "penalty" and self.overlong_cache >= self.max_new_tokens:
            raise ValueError("overlong-cache must be below max-new-tokens")

    @property
    def clip_bounds(self) -> tuple[float, float]:
        """(low, high): the ratio is clipped to [1 - low, 1 + high]."""
        return self.clip_range_low, self.clip_range_high

    def check_rollout(self) -> None:
        """A method's own checks of the rollout's shape, before the batch sizes' (groups)."""


def read_yaml(path: str | Path, config_class: type) -> tuple[dict[str, Any], list[str]]:
    """The values of a --config file by field name, and the old key names it used (renamed
    fields). Raises ValueError for a file that is not a mapping of known fields; the values are
    not converted yet (farmkit.cli converts them as the options would)."""
    import yaml

    from farmkit.core.yamltext import safe_yaml

    try:
        loaded = safe_yaml(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values")
    fields = field_values(config_class)
    # a field that keeps another name than its concept's answers to both (num_samples, samples_per_prompt)
    by_concept = {concept(field): name for name, field in fields.items()}
    values: dict[str, Any] = {}
    renamed: list[str] = []
    for key, value in loaded.items():
        name = str(key).replace("-", "_")
        name = by_concept.get(name, name)
        if name not in fields and RENAMED_FIELDS.get(name) in fields:
            renamed.append(str(key))
            name = RENAMED_FIELDS[name]
        if name not in fields:
            raise ValueError(f"{path}: unknown option {key!r}; known: {', '.join(sorted(fields))}")
        values[name] = value
    return values, renamed


# ---------------------------------------------------------------------------------------------
# Presets: a published method's settings under one name (--preset). They lie under whatever is
# given (a --config file, flags): defaults < preset < YAML < flags.


@dataclasses.dataclass(frozen=True)
class Preset:
    """The settings a publication ran a method with, by field name. A value may be a function of
    the other resolved values (`same_as`), for a setting the publication ties to another one."""

    source: str  # where the values come from, as --help shows it
    values: dict[str, Any]


def same_as(name: str) -> Any:
    """A preset value that follows another field's resolved value."""

    def follow(lookup: Any) -> Any:
        return lookup(name)

    return follow


def preset_field(presets: dict[str, Preset]) -> Any:
    """The `preset` field of a method config: its choices and their sources, in its help."""
    sources = "; ".join(f"{name}: {preset.source}" for name, preset in presets.items())
    return help_field(
        None,
        "Start from the settings a publication ran this method with; options given on the "
        "command line (and --config keys) override them, and meta.json records the preset and "
        f"the values the run resolved to. {sources}.",
        tuple(presets),
        presets=presets,
    )


def with_preset(config_class: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` (what was given) over the settings of the preset they name, if any."""
    fields = field_values(config_class)
    name = values.get("preset")
    if name is None or "preset" not in fields:
        return dict(values)
    presets: dict[str, Preset] = fields["preset"].metadata["presets"]
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(presets)}")
    resolved = dict(values)
    following = {}
    for key, value in presets[name].values.items():
        if key in values:
            continue
        if callable(value):
            following[key] = value
        else:
            resolved[key] = value

    def lookup(key: str) -> Any:
        return resolved[key] if key in resolved else fields[key].default

    resolved.update({key: follow(lookup) for key, follow in following.items()})
    return resolved


def build_config(config_class: type, values: dict[str, Any]) -> Any:
    """The config from field values (over the settings of the preset they name); raises
    ValueError (or TypeError) when it is not valid."""
    return config_class(**with_preset(config_class, values))


def config_dict(config: Any) -> dict[str, Any]:
    """The resolved configuration, as meta.json and provenance record it."""
    return dataclasses.asdict(config)
