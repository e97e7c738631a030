"""The GRPO loss family (farmkit.train.estimators) against TRL's own: GRPOTrainer._compute_loss
(TRL 1.16) called on a stand-in trainer that holds only what the method reads, its policy forward
replaced by the log-probabilities under test. Same log-probabilities, old log-probabilities,
advantages and masks on both sides, in float64, over two micro-batches of one minibatch (TRL: two
accumulation steps): the loss and its gradient with respect to the log-probabilities agree to
1e-5, on ragged masks, with an empty response, and with ratios up to e^9. farmkit's
--clip-range-high is TRL's epsilon_high, except for CISPO, whose TRL cap is the ratio's own bound:
1 + --clip-range-high. SAPO's and VESPO's parameters are TRL's GRPOConfig fields of the same
names, with the same defaults."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from packaging.version import Version

from farmkit.train import estimators as E
from farmkit.train import rollout_backends as RB

# the loss family's parity is with TRL 1.16's GRPOTrainer._compute_loss (the version locks/cpu.txt pins);
# an older TRL (make test-lowest: pyproject admits trl 1.0) computes these losses otherwise, or not at all
# (TRL is imported by the first test that needs it, not at collection: under make test's workers,
# each collects every file, and TRL's trainer costs seconds that only one of them uses)
if importlib.util.find_spec("trl") is None:
    pytest.skip("TRL is not installed", allow_module_level=True)
if Version(importlib.metadata.version("trl")) < Version("1.16"):
    pytest.skip(
        "the GRPO loss family is checked against TRL 1.16's _compute_loss; this TRL is older",
        allow_module_level=True,
    )


@functools.cache
def trl_grpo() -> tuple[type, dict[str, float]]:
    """TRL's GRPOTrainer, and SAPO's temperatures and VESPO's kernel: the loss parameters, by name,
    with TRL's defaults."""
    trainer = importlib.import_module("trl.trainer.grpo_trainer").GRPOTrainer
    params = {
        field.name: field.default
        for field in dataclasses.fields(importlib.import_module("trl").GRPOConfig)
        if field.name.startswith(("sapo_", "vespo_"))
    }
    return trainer, params


ROWS, WIDTH = 4, 6
LOW, HIGH = 0.2, 0.28


def batch(seed: int = 0, spread: float = 0.3, empty: bool = False) -> dict[str, torch.Tensor]:
    """Log-probabilities, old ones `spread` apart (some ratios beyond the clip range, some within;
    spread 3: token ratios from e^-9 to e^9), advantages of both signs and responses of different
    lengths (`empty`: row 1 has no tokens)."""
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(ROWS, WIDTH, generator=generator, dtype=torch.float64) * 3
    old = logprobs + spread * torch.randn(ROWS, WIDTH, generator=generator, dtype=torch.float64)
    mask = torch.ones(ROWS, WIDTH, dtype=torch.float64)
    mask[0, 4:] = 0
    mask[2, 2:] = 0
    if empty:
        mask[1] = 0
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2], dtype=torch.float64)
    return dict(logprobs=logprobs, old=old, mask=mask, advantages=advantages)


BATCHES = {
    "ragged": dict(),
    "empty-row": dict(empty=True),
    "large-ratios": dict(spread=3.0),
}


def trl_loss(
    loss_type: str,
    level: str,
    data: dict[str, torch.Tensor],
    low: float,
    high: float,
    extra: dict[str, torch.Tensor] | None = None,
    off_policy: float | None = None,
    beta: float = 0.0,
    bias_correction: bool = False,
    params: dict[str, float] | None = None,
    delta: float | None = None,
) -> tuple[float, torch.Tensor]:
    """(loss, gradient) of TRL's _compute_loss summed over two accumulation steps of two rows;
    with `beta`, its KL term to data["ref"] (use_bias_correction_kl: `bias_correction`);
    `params`: SAPO's and VESPO's, TRL's defaults where not given; `delta`: TRL's two-sided
    clipping."""
    logprobs = data["logprobs"].clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        part = logprobs[rows]
        mask = data["mask"][rows]
        trainer = SimpleNamespace(
            _get_per_token_logps_and_entropies=lambda *a, p=part, **k: (
                p,
                torch.zeros_like(p),
                None,
            ),
            top_entropy_quantile=1.0,
            off_policy_mask_threshold=off_policy,
            get_off_policy_mask=trl_grpo()[0].get_off_policy_mask,
            importance_sampling_level=level,
            beta=beta,
            loss_type=loss_type,
            epsilon_low=low,
            epsilon_high=high,
            args=SimpleNamespace(
                delta=delta,
                use_bias_correction_kl=bias_correction,
                steps_per_generation=2,
                **{**trl_grpo()[1], **(params or {})},
            ),
            get_gamma_weights=trl_grpo()[0].get_gamma_weights,
            use_vllm=extra is not None and "importance_sampling_ratio" in extra,
            vllm_importance_sampling_correction=True,
            model=SimpleNamespace(training=True),
            current_gradient_accumulation_steps=2,
            accelerator=SimpleNamespace(
                num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x
            ),
            _entropy_bonus_enabled=False,
            aux_loss_enabled=False,
            _metrics=defaultdict(lambda: defaultdict(list)),
            max_completion_length=WIDTH,
        )
        inputs = {
            "prompt_ids": torch.zeros(2, 0, dtype=torch.long),
            "prompt_mask": torch.zeros(2, 0, dtype=torch.long),
            "completion_ids": torch.zeros(2, WIDTH, dtype=torch.long),
            "completion_mask": mask,
            "advantages": data["advantages"][rows],
            "old_per_token_logps": data["old"][rows],
            "num_items_in_batch": data["mask"].sum(),  # the whole minibatch's tokens
            **({"ref_per_token_logps": data["ref"][rows]} if beta else {}),
            **{name: value[rows] for name, value in (extra or {}).items()},
        }
        total = total + trl_grpo()[0]._compute_loss(trainer, None, inputs)
    total.backward()
    return float(total.detach()), logprobs.grad


def farmkit_loss(
    name: str,
    data: dict[str, torch.Tensor],
    clip: tuple[float, float],
    weights: torch.Tensor | None = None,
    rollout_weights: torch.Tensor | None = None,
    params: dict[str, float] | None = None,
) -> tuple[float, torch.Tensor]:
    """(loss, gradient) of the registered loss, summed over the same two micro-batches."""
    logprobs = data["logprobs"].clone().requires_grad_()
    loss = E.policy_loss(name)
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        part, _ = loss(
            logprobs[rows],
            data["old"][rows],
            data["advantages"][rows],
            data["mask"][rows],
            clip,
            responses=ROWS,
            tokens=data["mask"].sum(),
            norm=WIDTH,
            weights=None if weights is None else weights[rows],
            rollout_weights=None if rollout_weights is None else rollout_weights[rows],
            params=params,
        )
        total = total + part
    total.backward()
    return float(total.detach()), logprobs.grad


def assert_same(ours: tuple[float, torch.Tensor], theirs: tuple[float, torch.Tensor]) -> None:
    assert ours[0] == pytest.approx(theirs[0], abs=1e-5)
    assert torch.allclose(ours[1], theirs[1], atol=1e-5), (ours[1], theirs[1])
    assert ours[1].abs().sum() > 0  # something to compare


# farmkit's name, TRL's loss_type and importance-sampling level, and TRL's epsilon_high
FAMILY = {
    "dapo": ("dapo", "token", HIGH),
    "bnpo": ("bnpo", "token", HIGH),
    "gspo": ("grpo", "sequence", HIGH),
    "cispo": ("cispo", "token", 1 + HIGH),
    "seq-mean-token-mean": ("grpo", "token", HIGH),
    "seq-mean-token-sum-norm": ("dr_grpo", "token", HIGH),
    "sapo": ("sapo", "token", HIGH),
    "luspo": ("luspo", "sequence", HIGH),
    "vespo": ("vespo", "token", HIGH),
}


@pytest.mark.parametrize("shape", sorted(BATCHES))
@pytest.mark.parametrize("name", sorted(FAMILY))
def test_each_loss_and_its_gradient_are_trls(name, shape):
    loss_type, level, trl_high = FAMILY[name]
    data = batch(**BATCHES[shape])
    assert_same(
        farmkit_loss(name, data, (LOW, HIGH)), trl_loss(loss_type, level, data, LOW, trl_high)
    )


def test_the_loss_parameters_and_their_defaults_are_trls():
    """farm-grpo's and farm-rloo's --sapo-* and --vespo-* options are TRL's GRPOConfig fields of
    the same names, with the same defaults, and each loss declares the ones it takes."""
    from farmkit.methods.group import GRPOConfig, RLOOConfig

    assert set(trl_grpo()[1]) == {*E.SAPO_TEMPERATURES, *E.VESPO_KERNEL}
    for config in (GRPOConfig(), RLOOConfig()):
        assert {name: getattr(config, name) for name in trl_grpo()[1]} == trl_grpo()[1]
    assert E.policy_loss("sapo").params == tuple(E.SAPO_TEMPERATURES)
    assert E.policy_loss("vespo").params == tuple(E.VESPO_KERNEL)
    assert GRPOConfig(policy_loss="sapo", sapo_temperature_neg=2.0).loss_params == {
        "sapo_temperature_pos": 1.0,
        "sapo_temperature_neg": 2.0,
    }
    assert GRPOConfig(policy_loss="dapo").loss_params == {}


# parameters apart from the defaults and from each other (a sign's value taken for the other's
# shows); over the large ratios too, where VESPO's kernel and SAPO's gate are far from 1
OWN_PARAMS = {
    "sapo": {"sapo_temperature_pos": 0.5, "sapo_temperature_neg": 3.0},
    "vespo": {
        "vespo_k_pos": 1.5,
        "vespo_lambda_pos": 0.7,
        "vespo_k_neg": 0.4,
        "vespo_lambda_neg": 4.0,
    },
}


@pytest.mark.parametrize("shape", ["ragged", "large-ratios"])
@pytest.mark.parametrize("name", sorted(OWN_PARAMS))
def test_the_loss_parameters_act_as_trls(name, shape):
    loss_type, level, trl_high = FAMILY[name]
    data, params = batch(**BATCHES[shape]), OWN_PARAMS[name]
    ours = farmkit_loss(name, data, (LOW, HIGH), params=params)
    assert_same(ours, trl_loss(loss_type, level, data, LOW, trl_high, params=params))
    assert abs(ours[0] - farmkit_loss(name, data, (LOW, HIGH))[0]) > 1e-3  # they count
    # farm-grpo's options of those names reach the loss
    options = dict(clip_range_low=LOW, clip_range_high=HIGH, kl_coef=0.0, **params)
    assert_same(group_loss(name, with_reference(data), **options), ours)


# TRL applies its delta to these losses' ratio (grpo, bnpo, dr_grpo, dapo, luspo; gspo is grpo at
# the sequence level), above 1 + HIGH as it recommends
TWO_SIDED = sorted(name for name in FAMILY if "delta" in E.policy_loss(name).params)
DELTA = 1.5


def test_the_two_sided_clipping_is_declared_by_trls_clipped_losses_only():
    assert TWO_SIDED == [
        "bnpo",
        "dapo",
        "gspo",
        "luspo",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ]


@pytest.mark.parametrize("shape", ["ragged", "large-ratios"])
@pytest.mark.parametrize("name", TWO_SIDED)
def test_delta_clips_the_ratio_from_above_as_trl(name, shape):
    """--delta (TRL's GRPOConfig.delta, INTELLECT-2's two-sided clipping): the loss and its
    gradient are TRL's with the same delta, they differ from those without it where some ratio of
    a negative advantage passes delta (the large ratios: GSPO's and LUSPO's length-normalised
    ratios stay below it on the ragged batch), and farm-grpo's option reaches the loss."""
    loss_type, level, trl_high = FAMILY[name]
    data, params = batch(**BATCHES[shape]), {"delta": DELTA}
    ours = farmkit_loss(name, data, (LOW, HIGH), params=params)
    assert_same(ours, trl_loss(loss_type, level, data, LOW, trl_high, delta=DELTA))
    if shape == "large-ratios":
        plain = farmkit_loss(name, data, (LOW, HIGH))
        assert abs(ours[0] - plain[0]) > 1e-4 and float((ours[1] - plain[1]).abs().max()) > 1e-4
    options = dict(clip_range_low=LOW, clip_range_high=HIGH, kl_coef=0.0, delta=DELTA)
    assert_same(group_loss(name, with_reference(data), **options), ours)


@pytest.mark.parametrize("name", ["cispo", "sapo", "vespo"])
def test_delta_is_refused_for_a_loss_without_a_clipped_ratio(name):
    from farmkit.methods.group import GRPOConfig

    with pytest.raises(ValueError, match="--delta"):
        GRPOConfig(policy_loss=name, delta=DELTA)


def test_luspo_weighs_each_response_by_its_length():
    """LUSPO is GSPO with each response's term multiplied by its length: on responses of one
    length L, L times GSPO's loss at the same clip range."""
    data = batch()
    data["mask"] = torch.ones(ROWS, WIDTH, dtype=torch.float64)
    gspo = farmkit_loss("gspo", data, (LOW, HIGH))
    luspo = farmkit_loss("luspo", data, (LOW, HIGH))
    assert luspo[0] == pytest.approx(WIDTH * gspo[0], rel=1e-12)
    assert torch.allclose(luspo[1], WIDTH * gspo[1], rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["token-truncate", "token-mask"])
def test_vespo_takes_the_rollout_correction_into_its_ratio_as_trl(mode):
    """VESPO's w is the ratio to the policy that sampled: with the rollout correction on, its
    weights (pi_trainer / pi_engine) multiply w inside the kernel instead of the terms, as TRL
    folds importance_sampling_ratio into VESPO's sequence weight."""
    data = batch()
    engine = data["old"] + 0.3 * torch.randn(
        ROWS, WIDTH, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    weights, _ = RB.rollout_correction(data["old"], engine, data["mask"], mode, cap=1.5)
    # TRL's ratio is exp(0) = 1 on padding; farmkit's weights are 0 there and left out
    trl_ratio = weights + (1 - data["mask"])
    ours = farmkit_loss("vespo", data, (LOW, HIGH), rollout_weights=weights)
    assert_same(
        ours,
        trl_loss("vespo", "token", data, LOW, HIGH, {"importance_sampling_ratio": trl_ratio}),
    )
    assert abs(ours[0] - farmkit_loss("vespo", data, (LOW, HIGH))[0]) > 1e-4  # they count


def test_gspo_clips_the_length_normalised_sequence_ratio_at_its_own_small_range():
    """GSPO's default range (3e-4, 4e-4): responses whose mean token log-ratio lies within it keep a
    gradient, the others (clipped on the pessimistic side) none; as TRL with those epsilons."""
    data = batch(spread=0.0)
    offsets = torch.tensor([1e-4, -2e-4, 0.05, -0.05], dtype=torch.float64)
    data["old"] = data["logprobs"] - offsets[:, None]
    low, high = E.policy_loss("gspo").clip
    assert (low, high) == (3e-4, 4e-4)
    ours = farmkit_loss("gspo", data, (low, high))
    assert_same(ours, trl_loss("grpo", "sequence", data, low, high))
    # rows 2 (A > 0, ratio above 1 + high) and 3 (A < 0, ratio below 1 - low) are clipped
    assert torch.all(ours[1][2:] == 0) and torch.all(ours[1][:2].abs().sum(dim=1) > 0)


def test_clip_higher_lets_positive_advantages_rise_further():
    """DAPO's clip-higher: a ratio between 1 + low and 1 + high keeps its gradient when the range is
    asymmetric and loses it when symmetric (the default)."""
    data = batch(spread=0.0)
    data["old"] = data["logprobs"] - 0.22  # ratio e^0.22 = 1.246 for every token
    symmetric = farmkit_loss("dapo", data, (LOW, LOW))
    higher = farmkit_loss("dapo", data, (LOW, HIGH))
    positive = data["advantages"] > 0
    assert torch.all(symmetric[1][positive] == 0)
    assert torch.all(higher[1][positive][data["mask"][positive] > 0] != 0)


@pytest.mark.parametrize("mode", RB.CORRECTION_MODES)
def test_rollout_correction_weights_are_trls_importance_sampling_ratio(mode):
    """The engine's log-probabilities apart from the trainer's old ones: the weights of each mode
    scale the loss as TRL's importance_sampling_ratio does, masked tokens or responses with no
    gradient at all."""
    data = batch()
    engine = data["old"] + 0.8 * torch.randn(
        ROWS, WIDTH, generator=torch.Generator().manual_seed(1)
    )
    weights, figures = RB.rollout_correction(data["old"], engine, data["mask"], mode, cap=2.0)
    ratio = weights if weights.dim() == 2 else weights[:, None]
    assert_same(
        farmkit_loss("dapo", data, (LOW, HIGH), weights),
        trl_loss("dapo", "token", data, LOW, HIGH, {"importance_sampling_ratio": ratio}),
    )
    if mode.endswith("mask"):
        assert 0 < figures["rollout_masked_fraction"] < 1
        _, gradient = farmkit_loss("dapo", data, (LOW, HIGH), weights)
        masked = (ratio == 0).expand_as(gradient) & (data["mask"] > 0)
        assert masked.any() and torch.all(gradient[masked] == 0)


def test_the_off_policy_mask_is_trls():
    """DeepSeek-V3.2's off-policy sequence mask (TRL's off_policy_mask_threshold): a response with a
    negative advantage whose mean sampling-minus-current log-probability exceeds the threshold is
    dropped from the loss."""
    data = batch()
    sampling = data["logprobs"].clone()
    sampling[1] += 0.9  # row 1: A < 0 and far from the current policy: dropped
    sampling[0] += 0.9  # row 0: A > 0: kept however far
    keep = RB.off_policy_keep(data["advantages"], data["logprobs"], sampling, data["mask"], 0.5)
    assert keep.tolist() == [1.0, 0.0, 1.0, 1.0]
    theirs = trl_grpo()[0].get_off_policy_mask(
        data["advantages"][:, None], data["logprobs"], sampling, data["mask"], 0.5
    )
    assert torch.equal(keep, theirs[:, 0])
    assert_same(
        farmkit_loss("dapo", data, (LOW, HIGH), keep),
        trl_loss(
            "dapo", "token", data, LOW, HIGH, {"sampling_per_token_logps": sampling}, off_policy=0.5
        ),
    )


def group_loss(name: str, data: dict[str, torch.Tensor], **config) -> tuple[float, torch.Tensor]:
    """(loss, gradient) of farm-grpo's method (surrogate and KL term) over the same two
    micro-batches, the trainer's MicroBatch built from `data`."""
    from farmkit.methods.group import GroupMethod, GRPOConfig
    from farmkit.train.onpolicy import MicroBatch, Prepared

    method = GroupMethod(
        GRPOConfig(policy_loss=name, max_new_tokens=WIDTH, kl_estimator="k3", **config)
    )
    logprobs = data["logprobs"].clone().requires_grad_()
    prepared = Prepared(data["advantages"], None)
    total = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        index = torch.arange(ROWS)[rows]
        micro = MicroBatch(
            logprobs[rows],
            None,
            index,
            data["mask"][rows],
            data["old"][rows],
            data["ref"][rows],
            ROWS,
            data["mask"].sum(),
        )
        part, _ = method.loss(micro, prepared)
        total = total + part
    total.backward()
    return float(total.detach()), logprobs.grad


def with_reference(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    noise = torch.randn(ROWS, WIDTH, generator=generator, dtype=torch.float64)
    return {**data, "ref": data["logprobs"] + 0.4 * noise}


@pytest.mark.parametrize("bias_correction", [False, True])
@pytest.mark.parametrize("name", sorted(FAMILY))
def test_the_kl_term_in_the_loss_is_weighed_as_trls(name, bias_correction):
    """--kl-in loss: the KL term (k3, beta 0.1) of each loss is weighed over uneven lengths as that
    loss weighs its tokens (GRPO: per response, then over responses; dapo: every token alike...), as
    TRL adds it to each token's term before the loss's aggregation; with --kl-bias-correction
    multiplied by the importance ratio, as TRL's use_bias_correction_kl (its default)."""
    loss_type, level, trl_high = FAMILY[name]
    data = with_reference(batch())
    ours = group_loss(
        name,
        data,
        clip_range_low=LOW,
        clip_range_high=HIGH,
        kl_in="loss",
        kl_coef=0.1,
        kl_bias_correction=bias_correction,
    )
    theirs = trl_loss(
        loss_type, level, data, LOW, trl_high, beta=0.1, bias_correction=bias_correction
    )
    assert_same(ours, theirs)
    without = group_loss(name, data, clip_range_low=LOW, clip_range_high=HIGH, kl_coef=0.0)
    assert abs(ours[0] - without[0]) > 1e-3  # the KL term counts


def test_the_bias_corrected_kl_differs_from_the_plain_one_off_policy():
    """Where the policy has moved from the sampling one (ratios not 1), TRL's bias-corrected KL
    and farmkit's default (TRL's use_bias_correction_kl=False) differ; the option says which."""
    data = with_reference(batch())
    options = dict(kl_in="loss", kl_coef=0.1, clip_range_low=LOW, clip_range_high=HIGH)
    plain = group_loss("dapo", data, **options)
    corrected = group_loss("dapo", data, kl_bias_correction=True, **options)
    assert abs(plain[0] - corrected[0]) > 1e-4
    assert float((plain[1] - corrected[1]).abs().max()) > 1e-3


def test_gspo_counts_an_empty_response_as_trl_does():
    """A response without tokens has no ratio to clip: GSPO's loss counts it 0 (TRL's average over
    its tokens), not -advantage; the gradient was already the same."""
    data = batch()
    data["mask"][1] = 0
    assert_same(
        farmkit_loss("gspo", data, (LOW, HIGH)), trl_loss("grpo", "sequence", data, LOW, HIGH)
    )
