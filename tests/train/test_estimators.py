"""Hand-computed checks of the arithmetic PPO and Quark rest on: masked whitening (also across
processes), GAE, the per-token KL penalty, the clipped losses, response masks and quantiles."""

from __future__ import annotations

import math

import pytest
import torch

from farmkit.methods.quark import assign_quantiles
from farmkit.train.estimators import policy_loss
from farmkit.train.rl_common import (
    clipped_value_loss,
    generalized_advantages,
    kl_estimate,
    kl_penalized_rewards,
    linear_schedule,
    masked_mean,
    masked_whiten,
    overlong_penalty,
    response_mask,
)


def test_whitening_uses_only_masked_entries():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, -100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # masked entries 1, 2, 3, 4: mean 2.5, population variance 1.25; padding comes back as 0
    expected = torch.tensor([[-1.5, -0.5, 0.5], [1.5, 0.0, 0.0]]) / math.sqrt(1.25)
    assert torch.allclose(masked_whiten(values, mask), expected, atol=1e-5)
    kept_mean = masked_whiten(values, mask, shift_mean=False)
    assert torch.allclose(kept_mean, (expected + 2.5) * mask, atol=1e-5)


def _whiten_in_a_process(
    rank: int, store: str, values: torch.Tensor, mask: torch.Tensor, rows: slice, results
) -> None:
    """One of two gloo processes: whiten its rows with statistics summed across both (as PPO does)."""
    import torch.distributed as dist

    # a file rendezvous: no port to pick, so no race with another process taking it first
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)

    def reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    # plain lists, not tensors: a tensor travels as a shared-memory handle that is gone once this
    # process exits, and the parent may read the queue after that
    results.put((rank, masked_whiten(values[rows], mask[rows], reduce=reduce_sum).tolist()))
    dist.destroy_process_group()


@pytest.mark.heavy
def test_whitening_across_processes_equals_whitening_the_whole_batch(tmp_path):
    """Two processes whose reduce sums their statistics over gloo (as accelerate's reduce does) get
    the same numbers as one process holding the whole rollout batch, although their halves differ."""
    import torch.multiprocessing as mp

    values = torch.tensor([[1.0, 5.0, 0.0], [2.0, 2.0, 9.0], [7.0, 0.0, 0.0], [3.0, 1.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    whole = masked_whiten(values, mask)
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(
            target=_whiten_in_a_process,
            args=(rank, str(tmp_path / "store"), values, mask, rows, results),
        )
        for rank, rows in ((0, slice(0, 1)), (1, slice(1, 4)))
    ]
    for process in processes:
        process.start()
    gathered = dict(results.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert torch.allclose(torch.tensor(gathered[0] + gathered[1]), whole, atol=1e-6)
    assert not torch.allclose(
        masked_whiten(values[:1], mask[:1]), whole[:1], atol=1e-3
    )  # per-process would differ


def test_masked_mean_ignores_padding():
    assert masked_mean(
        torch.tensor([[2.0, 4.0, 1000.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    ).item() == pytest.approx(3.0)


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.3, 0.7, 99.0]])
    values = torch.tensor([[0.5, 0.2, 0.1], [0.1, 0.4, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = generalized_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(advantages, torch.tensor([[0.5, 0.8, 0.9], [0.9, 0.3, 0.0]]), atol=1e-6)
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.7, 0.0]]), atol=1e-6)


def test_gae_discounts_when_asked():
    rewards, values, mask = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 1.0]]), torch.ones(1, 2)
    # delta_1 = 2 - 1 = 1; delta_0 = 1 + 0.5 * 1 - 0.5 = 1; A_0 = 1 + 0.5 * 0.5 * 1 = 1.25
    advantages, returns = generalized_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    assert torch.allclose(advantages, torch.tensor([[1.25, 1.0]]))
    assert torch.allclose(returns, torch.tensor([[1.75, 2.0]]))


def test_gae_estimator_whitens_the_advantages():
    """PPO's registered estimator: GAE's advantages, whitened over the batch's response tokens (mean
    0, variance 1 there, 0 on padding), and GAE's returns as they are."""
    from farmkit.train.estimators import advantage_estimator

    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.3, 0.7, 99.0]])
    values = torch.tensor([[0.5, 0.2, 0.1], [0.1, 0.4, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = advantage_estimator("gae")(rewards, values, mask)
    raw = [0.5, 0.8, 0.9, 0.9, 0.3]  # test_gae_with_gamma_and_lambda_one..., by hand
    mean = sum(raw) / 5
    std = math.sqrt(sum((a - mean) ** 2 for a in raw) / 5)
    expected = [(a - mean) / std for a in raw]
    assert torch.allclose(advantages[mask.bool()], torch.tensor(expected), atol=1e-4)
    assert advantages[1, 2] == 0
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.7, 0.0]]), atol=1e-6)


def test_kl_penalty_per_token_and_score_on_the_last_token():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, -7.0]])
    ref_logprobs = torch.tensor([[-1.5, -2.0, -1.0], [-2.0, -2.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, kl = kl_penalized_rewards(
        torch.tensor([2.0, -1.0]), logprobs, ref_logprobs, mask, kl_coef=0.1
    )
    assert torch.allclose(kl, torch.tensor([[0.5, 0.0, 0.5], [1.0, -1.0, 0.0]]))
    # row 2 ends at index 1: its score lands there and the padded token gets nothing
    assert torch.allclose(rewards, torch.tensor([[-0.05, 0.0, 1.95], [-0.1, 0.1 - 1.0, 0.0]]))


def test_policy_loss_clips_only_in_the_pessimistic_direction():
    old = torch.zeros(1, 5)
    ratios = torch.tensor([[1.5, 1.5, 0.5, 0.5, 3.0]])
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    surrogate = policy_loss("token-mean")
    loss, stats = surrogate(torch.log(ratios), old, advantages, mask, 0.2, responses=1, tokens=4)
    # per token max(-A r, -A clip(r)): -1.2 (clipped), 1.5, -0.5, 0.8 (clipped); padding left out
    assert loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)
    # a minibatch split in micro-batches divides by the minibatch's token count
    half, _ = surrogate(torch.log(ratios), old, advantages, mask, 0.2, responses=1, tokens=8)
    assert half.item() == pytest.approx(loss.item() / 2)


def test_value_loss_takes_the_larger_of_clipped_and_unclipped_errors():
    old = torch.tensor([[1.0, 1.0, 0.0]])
    new = torch.tensor([[2.0, 1.5, 7.0]])
    returns = torch.tensor([[1.5, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = clipped_value_loss(new, old, returns, mask, clip=0.2)
    # token 1: clipped value 1.2, errors 0.25 vs 0.09 -> 0.25; token 2: clipped 1.2, errors 0.25 vs 0.64 -> 0.64
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.64) / 2)
    assert stats["value_clip_fraction"].item() == pytest.approx(0.5)


def test_response_mask_keeps_the_first_eos_and_drops_what_follows():
    ids = torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8], [2, 2, 2, 2], [5, 2, 9, 2]])
    mask, finished = response_mask(ids, eos_token_id=2)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert finished.tolist() == [True, False, True, True]


def test_quantiles_rank_best_first_and_split_evenly():
    assert assign_quantiles([0.1, 0.9, 0.5, 0.5, 0.3, 0.7], 3) == [2, 0, 1, 1, 2, 0]
    assert sorted(assign_quantiles([float(i) for i in range(10)], 5)) == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
    ]


def test_kl_estimators_by_hand():
    logprobs, ref_logprobs = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    # log-ratios 0.5 and -1.0
    assert torch.allclose(kl_estimate(logprobs, ref_logprobs, "k1"), torch.tensor([[0.5, -1.0]]))
    assert torch.allclose(
        kl_estimate(logprobs, ref_logprobs, "clamped"), torch.tensor([[0.5, 0.0]])
    )
    # k3 = (r - 1) - log r with r = exp(-log-ratio)
    expected = torch.tensor([[math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]])
    assert torch.allclose(kl_estimate(logprobs, ref_logprobs, "k3"), expected)
    mask = torch.ones(1, 2)
    rewards, kl = kl_penalized_rewards(
        torch.tensor([1.0]), logprobs, ref_logprobs, mask, kl_coef=0.1, estimator="clamped"
    )
    assert torch.allclose(kl, torch.tensor([[0.5, 0.0]])) and torch.allclose(
        rewards, torch.tensor([[-0.05, 1.0]])
    )


def test_linear_schedule_warms_up_then_decays_to_zero():
    factor = linear_schedule(warmup=2, total=6)
    assert [factor(step) for step in range(7)] == pytest.approx(
        [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    )
    assert [linear_schedule(0, 4)(step) for step in range(4)] == pytest.approx(
        [1.0, 0.75, 0.5, 0.25]
    )


def test_overlong_penalty_falls_linearly_over_the_last_cache_tokens():
    """DAPO's soft overlong punishment with max length 20 and a cache of 8: nothing up to 12
    tokens, then -1/8 per token, -1 at 20."""
    lengths = torch.tensor([5.0, 12.0, 14.0, 16.0, 20.0])
    assert overlong_penalty(lengths, 20, 8).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
