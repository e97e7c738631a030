"""The mutation gate: each named mutation breaks one method on purpose, alone, in a copy of the
repository; the tests named for it then run there, and at least one must fail. Not a framework:
each mutation is an exact search-and-replace, so a mutation whose old text has gone from the code
(or appears more than once) is an error, not a silent pass.

    python dev/mutants.py            # every mutation (make mutants; slow: models train)
    python dev/mutants.py --fast     # the cheap subset CI runs (make mutants-fast)
    python dev/mutants.py --only NAME [--only NAME ...] [--list]

First the named tests run once on the unmutated copy (they must pass, or a failure under a mutation
proves nothing); then each mutation. Prints a table (mutation, caught, by which test) and exits 1
when a mutation survives, its old text is not found exactly once, or the baseline fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids, cheapest first (the run stops at the first failure)
    fast: bool = False  # in the CI subset


T_GROUP = "tests/methods/test_group.py"
T_GROUP_POOL = "tests/methods/test_group_pool.py"
T_PAIRWISE = "tests/train/test_pairwise.py"
T_RL = "tests/train/test_estimators.py"
T_TEMP = "tests/lm/test_generation_temperature.py"
T_TRL = "tests/train/test_estimators_trl.py"
T_LOOP = "tests/train/test_onpolicy.py"
T_ASYNC = "tests/train/test_async_rollouts.py"

MUTATIONS = [
    # --- temperature, at each place a sampling temperature reaches the model
    Mutation(
        "generate: temperature ignored (always 1)",
        "farmkit/lm/generation.py",
        "kwargs.update(temperature=config.temperature, top_p=config.top_p, top_k=0)",
        "kwargs.update(temperature=1.0, top_p=config.top_p, top_k=0)",
        (f"{T_TEMP}::test_generate_follows_the_temperature",),
        fast=True,
    ),
    Mutation(
        "generate: temperature 0 samples instead of decoding greedily",
        "farmkit/lm/generation.py",
        "sampling = config.temperature > 0",
        "sampling = True",
        (f"{T_TEMP}::test_generate_at_temperature_zero_is_greedy",),
    ),
    Mutation(
        "rollout sampling: temperature ignored (always 1)",
        "farmkit/train/policy.py",
        "            do_sample=True,\n            temperature=temperature,",
        "            do_sample=True,\n            temperature=1.0,",
        (f"{T_TEMP}::test_rollout_sampling_follows_the_temperature",),
    ),
    Mutation(
        "rollout log-probs: logits not divided by the temperature",
        "farmkit/train/policy.py",
        "return out.logits[:, :-1].float() / temperature",
        "return out.logits[:, :-1].float()",
        (f"{T_TEMP}::test_response_logits_are_divided_by_the_temperature",),
    ),
    # --- truncated sampling (--top-p, --top-k): the kept set replayed in training
    Mutation(
        "top-p/top-k: mask replay removed (log-probs over the whole vocabulary)",
        "farmkit/train/policy.py",
        "    kept = rollout.kept\n    if kept is None:\n        return logits",
        "    kept = rollout.kept\n    if True:\n        return logits",
        (
            "tests/train/test_rollout_backends.py::"
            "test_top_p_top_k_rollouts_replayed_in_training_give_a_ratio_of_one",
            f"{T_LOOP}::test_top_p_top_k_rollouts_are_scored_over_the_tokens_the_sampler_kept"
            "[recomputed]",
        ),
        fast=True,
    ),
    Mutation(
        "top-p/top-k: the trainer's forward not replayed",
        "farmkit/train/onpolicy.py",
        "return P.replayed_logits(logits, chunk), values",
        "return logits, values",
        (
            f"{T_LOOP}::test_top_p_top_k_rollouts_are_scored_over_the_tokens_the_sampler_kept"
            "[recomputed]",
        ),
    ),
    # --- group methods
    Mutation(
        "GRPO: no division by the group's std (where the config applies it)",
        "farmkit/methods/group.py",
        '"dr_grpo" if self.dr_grpo else "grpo"',
        '"dr_grpo"',
        (f"{T_GROUP}::test_grpo_config_standardizes_and_dr_grpo_does_not",),
        fast=True,
    ),
    Mutation(
        "GRPO: std division removed from the estimator",
        "farmkit/train/estimators.py",
        "centred = centred / (grouped.std(dim=1, keepdim=True) + eps)",
        "centred = centred",
        (f"{T_GROUP}::test_grpo_advantages_are_standardized_per_group_and_sum_to_zero",),
    ),
    Mutation(
        "GRPO/RLOO: ratio clipping removed",
        "farmkit/methods/group.py",
        "            config.clip_bounds,\n",
        "            1e9,\n",
        (f"{T_GROUP}::test_group_loss_clips_the_ratio",),
        fast=True,
    ),
    Mutation(
        "RLOO: the baseline includes the sample itself",
        "farmkit/train/estimators.py",
        "baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (k - 1)",
        "baseline = grouped.mean(dim=1, keepdim=True)",
        (f"{T_GROUP}::test_the_leave_one_out_baseline_excludes_the_sample_itself",),
        fast=True,
    ),
    Mutation(
        "GRPO: KL term left out of the loss",
        "farmkit/methods/group.py",
        "loss = loss + config.kl_coef * kl_loss",
        "loss = loss",
        (f"{T_GROUP}::test_group_loss_adds_the_kl_term",),
    ),
    # --- the GRPO loss family (checked against TRL's), rollout correction, DAPO's sampling
    Mutation(
        "DAPO: tokens averaged per micro-batch, not over the minibatch",
        "farmkit/train/estimators.py",
        'register_policy_loss("dapo", RESPONSE, token_mean, params=TWO_SIDED)',
        'register_policy_loss("dapo", RESPONSE, micro_token_mean, params=TWO_SIDED)',
        (f"{T_TRL}::test_each_loss_and_its_gradient_are_trls[dapo-ragged]",),
        fast=True,
    ),
    Mutation(
        "clip-higher: the upper clip bound is the lower one",
        "farmkit/train/rl_common.py",
        "clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)",
        "clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + low)",
        (f"{T_TRL}::test_clip_higher_lets_positive_advantages_rise_further",),
    ),
    Mutation(
        "delta: the two-sided clipping's cap ignored",
        "farmkit/train/rl_common.py",
        "unclipped = -advantages * (ratio if delta is None else ratio.clamp(max=delta))",
        "unclipped = -advantages * ratio",
        (f"{T_TRL}::test_delta_clips_the_ratio_from_above_as_trl[dapo-large-ratios]",),
        fast=True,
    ),
    Mutation(
        "BNPO: a micro-batch weighs as the whole minibatch",
        "farmkit/train/estimators.py",
        "share = mask.shape[0] / responses",
        "share = 1.0",
        (f"{T_TRL}::test_each_loss_and_its_gradient_are_trls[bnpo-ragged]",),
    ),
    Mutation(
        "GSPO: the sequence ratio not length-normalized",
        "farmkit/train/estimators.py",
        "clipped_policy_terms(log_ratio / length, advantages[:, None], low, high, delta)",
        "clipped_policy_terms(log_ratio, advantages[:, None], low, high, delta)",
        (f"{T_TRL}::test_each_loss_and_its_gradient_are_trls[gspo-ragged]",),
    ),
    Mutation(
        "CISPO: the clipped weight keeps its gradient",
        "farmkit/train/estimators.py",
        "log_ratio = logprobs.detach() - old_logprobs",
        "log_ratio = logprobs - old_logprobs",
        (f"{T_TRL}::test_each_loss_and_its_gradient_are_trls[cispo-ragged]",),
    ),
    Mutation(
        "SAPO: the temperatures of positive and negative advantages swapped",
        "farmkit/train/estimators.py",
        "torch.where(per_token > 0, sapo_temperature_pos, sapo_temperature_neg)",
        "torch.where(per_token > 0, sapo_temperature_neg, sapo_temperature_pos)",
        (f"{T_TRL}::test_each_loss_and_its_gradient_are_trls[sapo-ragged]",),
    ),
    Mutation(
        "LUSPO: the length factor dropped (GSPO's weighing)",
        "farmkit/train/estimators.py",
        '"luspo", RESPONSE, seq_mean_token_sum, per_response_weights=True, params=TWO_SIDED',
        '"luspo", RESPONSE, seq_mean_token_mean, per_response_weights=True, params=TWO_SIDED',
        (f"{T_TRL}::test_each_loss_and_its_gradient_are_trls[luspo-ragged]",),
    ),
    Mutation(
        "VESPO: the response's ratio length-normalized (GSPO's)",
        "farmkit/train/estimators.py",
        "log_w = (log_ratio * mask).sum(dim=1)\n",
        "log_w = (log_ratio * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)\n",
        (f"{T_TRL}::test_each_loss_and_its_gradient_are_trls[vespo-ragged]",),
    ),
    Mutation(
        "VESPO: the rollout correction on its terms, not in its ratio",
        "farmkit/train/estimators.py",
        "        if self.rollout_in_ratio:\n",
        "        if False:\n",
        (f"{T_TRL}::test_vespo_takes_the_rollout_correction_into_its_ratio_as_trl",),
    ),
    Mutation(
        "rollout correction: mask modes truncate instead",
        "farmkit/train/rollout_backends.py",
        'weights = ratio.clamp(max=cap) if action == "truncate" else ratio.masked_fill(above, 0.0)',
        "weights = ratio.clamp(max=cap)",
        (
            "tests/train/test_rollout_backends.py::"
            "test_rollout_correction_truncates_or_masks_exp_of_trainer_minus_engine",
        ),
        fast=True,
    ),
    # --- group rewards from a pool (--pool): each verdict's scores reach the responses it judged
    Mutation(
        "pool rewards: a verdict's win given to the response it went against",
        "farmkit/train/pairwise.py",
        "(first, second, 2.0 - float(preference))",
        "(first, second, float(preference) - 1.0)",
        (
            f"{T_PAIRWISE}::test_rewards_are_the_win_rates_the_verdicts_imply_on_the_right_responses",
            f"{T_GROUP_POOL}::test_the_judge_s_preference_is_learned",
        ),
        fast=True,
    ),
    Mutation(
        "pool rewards: a group's rewards given to its responses in the wrong order",
        "farmkit/train/pairwise.py",
        "rewards += self.reward(self.size, outcomes(schedule, verdicts))",
        "rewards += self.reward(self.size, outcomes(schedule, verdicts))[::-1]",
        (
            f"{T_PAIRWISE}::test_rewards_are_the_win_rates_the_verdicts_imply_on_the_right_responses",
        ),
        fast=True,
    ),
    Mutation(
        "off-policy mask: responses with positive advantages dropped too",
        "farmkit/train/rollout_backends.py",
        "return ((advantages >= 0) | (divergence <= threshold)).to(mask.dtype)",
        "return (divergence <= threshold).to(mask.dtype)",
        (f"{T_TRL}::test_the_off_policy_mask_is_trls",),
    ),
    Mutation(
        "dynamic sampling: dropped groups chosen before the informative ones",
        "farmkit/train/onpolicy.py",
        "chosen = (kept + dropped)[:groups]",
        "chosen = (dropped + kept)[:groups]",
        (f"{T_LOOP}::test_dynamic_sampling_replaces_groups_without_signal",),
    ),
    Mutation(
        "loss counts: each process divides by its own tokens (no reduction over processes)",
        "farmkit/train/onpolicy.py",
        "world, responses, tokens = reduce_sum(local)",
        "world, responses, tokens = local",
        (
            f"{T_LOOP}::test_two_processes_share_of_a_minibatch_update_each_loss_as_one_process",
            f"{T_LOOP}::test_two_processes_update_each_loss_as_one_process_does",
        ),
        fast=True,
    ),
    Mutation(
        "overlong filter: cut responses kept in the loss's mask, its count and the KL term",
        "farmkit/train/onpolicy.py",
        "step.loss_mask = step.mask * finished[:, None]",
        "step.loss_mask = step.mask",
        (
            f"{T_LOOP}::test_overlong_penalty_lowers_the_score_and_the_filter_leaves_cut_answers_out",
        ),
    ),
    Mutation(
        "async rollouts: the sampling copy never refilled (batches sampled by the first weights)",
        "farmkit/train/async_rollouts.py",
        "held.model.load_state_dict(policy.state_dict())",
        "pass",
        (
            f"{T_ASYNC}::test_staleness_0_trains_exactly_as_the_synchronous_run",
            f"{T_ASYNC}::test_a_stale_batch_carries_the_sampling_weights_logprobs_and_the_ratio_corrects_it",
        ),
    ),
    Mutation(
        "async rollouts: a stale batch without its sampling weights' log-probabilities (no correction)",
        "farmkit/train/async_rollouts.py",
        "if logprobs is None and version < number:",
        "if False:",
        (
            f"{T_ASYNC}::test_a_stale_batch_carries_the_sampling_weights_logprobs_and_the_ratio_corrects_it",
        ),
        fast=True,
    ),
    Mutation(
        "importance-sampling cap with the hf backend: the single pass turned off",
        "farmkit/train/onpolicy.py",
        "            correcting = False\n",
        "",
        (
            f"{T_LOOP}::test_overlong_penalty_lowers_the_score_and_the_filter_leaves_cut_answers_out",
        ),
    ),
    Mutation(
        "KL in the loss: always a token mean, whatever the loss's weighing",
        "farmkit/methods/group.py",
        "kl_loss = policy_loss(config.policy_loss).aggregate(",
        "kl_loss = __import__('farmkit.train.estimators', fromlist=['E']).token_mean(",
        (f"{T_TRL}::test_the_kl_term_in_the_loss_is_weighed_as_trls",),
        fast=True,
    ),
    Mutation(
        "KL bias correction ignored",
        "farmkit/methods/group.py",
        "kl = kl * importance_ratio(micro, policy_loss(config.policy_loss))",
        "kl = kl + 0 * importance_ratio(micro, policy_loss(config.policy_loss))",
        (f"{T_TRL}::test_the_kl_term_in_the_loss_is_weighed_as_trls",),
        fast=True,
    ),
    Mutation(
        "GSPO: a response without tokens counts -advantage in the loss",
        "farmkit/train/estimators.py",
        "else (mask.sum(dim=1, keepdim=True) > 0).to(terms.dtype)",
        "else mask.new_ones(terms.shape).to(terms.dtype)",
        (f"{T_TRL}::test_gspo_counts_an_empty_response_as_trl_does",),
        fast=True,
    ),
    Mutation(
        "overlong penalty: falls over the whole length, not the cache",
        "farmkit/train/rl_common.py",
        "return ((expected - lengths.float()) / cache).clamp(min=-1.0, max=0.0)",
        "return ((expected - lengths.float()) / max_length).clamp(min=-1.0, max=0.0)",
        (f"{T_RL}::test_overlong_penalty_falls_linearly_over_the_last_cache_tokens",),
    ),
    # --- PPO
    Mutation(
        "PPO: KL penalty removed",
        "farmkit/methods/ppo.py",
        "batch.scores, old_logprobs, ref_logprobs, mask, config.kl_coef, config.kl_estimator",
        "batch.scores, old_logprobs, ref_logprobs, mask, 0.0, config.kl_estimator",
        ("tests/methods/test_ppo.py::test_the_configured_kl_estimator_is_the_penalty",),
    ),
    Mutation(
        "KL penalty: sign flipped (a bonus)",
        "farmkit/train/rl_common.py",
        "rewards = -kl_coef * kl",
        "rewards = kl_coef * kl",
        (f"{T_RL}::test_kl_penalty_per_token_and_score_on_the_last_token",),
        fast=True,
    ),
    Mutation(
        "PPO: advantages not whitened",
        "farmkit/train/estimators.py",
        "return rl_common.masked_whiten(advantages, mask, reduce=reduce), returns",
        "return advantages, returns",
        (f"{T_RL}::test_gae_estimator_whitens_the_advantages",),
        fast=True,
    ),
    Mutation(
        "GAE: no bootstrap from the next value",
        "farmkit/train/rl_common.py",
        "delta = rewards[:, t] + gamma * next_value - values[:, t]",
        "delta = rewards[:, t] - values[:, t]",
        (f"{T_RL}::test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value",),
    ),
    Mutation(
        "PPO: value clipping removed",
        "farmkit/train/rl_common.py",
        "loss = 0.5 * masked_sum(torch.maximum(unclipped_error, clipped_error), mask) / count",
        "loss = 0.5 * masked_sum(unclipped_error, mask) / count",
        (f"{T_RL}::test_value_loss_takes_the_larger_of_clipped_and_unclipped_errors",),
    ),
    Mutation(
        "PPO surrogate: ratio clipping removed",
        "farmkit/train/rl_common.py",
        "return torch.maximum(unclipped, clipped), figures",
        "return unclipped, figures",
        (f"{T_RL}::test_policy_loss_clips_only_in_the_pessimistic_direction",),
    ),
    # --- Quark
    Mutation(
        "Quark: later rounds sampled without the top-quantile token",
        "farmkit/methods/quark.py",
        "control = self.token_ids[:1] if number > 0 and self.tokens else []",
        "control = []",
        ("tests/methods/test_quark.py::test_later_rounds_sample_behind_the_top_quantile_token",),
    ),
    Mutation(
        "Quark: --keep all trains every quantile behind one token",
        "farmkit/methods/quark.py",
        "[ids + token_ids[q : q + 1] for ids, (_, q) in zip(prompt_ids, local, strict=True)],",
        "[ids + token_ids[:1] for ids, (_, q) in zip(prompt_ids, local, strict=True)],",
        ("tests/methods/test_quark.py::test_keep_all_trains_every_quantile_with_its_token",),
    ),
    Mutation(
        "Quark: KL term removed",
        "farmkit/methods/quark.py",
        "accelerator.backward(nll + config.kl_coef * kl)",
        "accelerator.backward(nll)",
        ("tests/methods/test_quark.py::test_the_kl_term_changes_the_result",),
    ),
    # --- reward model, best-of-n
    Mutation(
        "reward model: loss sign flipped",
        "farmkit/methods/reward.py",
        "return F.binary_cross_entropy_with_logits(reward_2 - reward_1, target)",
        "return F.binary_cross_entropy_with_logits(reward_1 - reward_2, target)",
        ("tests/methods/test_reward.py::test_soft_label_loss_is_minimal_at_the_target_odds",),
        fast=True,
    ),
    Mutation(
        "best-of-n: picks the lowest",
        "farmkit/methods/bon.py",
        "return window.index(max(window))",
        "return window.index(min(window))",
        ("tests/methods/test_bon.py::test_choice_is_the_argmax_of_scores_recomputed_apart",),
    ),
    # --- DPO, online DPO, SFT
    Mutation(
        "DPO: loss types not passed to TRL",
        "farmkit/methods/dpo.py",
        "loss_type=config.losses,",
        "",
        ("tests/methods/test_dpo.py::test_loss_variants_reach_trl",),
    ),
    Mutation(
        "DPO/online DPO: chosen and rejected swapped",
        "farmkit/core/records.py",
        '"chosen": item.chosen,\n                "rejected": item.rejected,',
        '"chosen": item.rejected,\n                "rejected": item.chosen,',
        ("tests/methods/test_dpo.py::test_dpo_raises_the_chosen_over_rejected_margin",),
    ),
    Mutation(
        "online DPO: labels inverted before training",
        "farmkit/methods/online_dpo.py",
        'pairs, counts = dpo_pairs(list(read_records(prefs, "preference")), str(prefs))',
        'pairs, counts = dpo_pairs(list(read_records(prefs, "preference")), str(prefs))\n'
        '        pairs = [{**p, "chosen": p["rejected"], "rejected": p["chosen"]} for p in pairs]',
        ("tests/methods/test_online_dpo.py::test_default_pool_is_offline_and_the_folder_samples",),
    ),
    Mutation(
        "SFT: prompt unmasked (completion_only_loss=False)",
        "farmkit/methods/sft.py",
        "completion_only_loss=True,",
        "completion_only_loss=False,",
        ("tests/methods/test_sft.py::test_prompt_tokens_carry_no_loss_in_the_trainer",),
    ),
    Mutation(
        "SFT: prompt unmasked (completion mask of ones)",
        "farmkit/methods/sft.py",
        "mask = ([0] * len(prompt_ids) + [1] * len(completion_ids))[:max_length]",
        "mask = ([1] * len(prompt_ids) + [1] * len(completion_ids))[:max_length]",
        ("tests/methods/test_sft.py::test_prompt_tokens_carry_no_loss_in_the_trainer",),
        fast=True,
    ),
    # --- effects that tests once checked by spying on a library function (issue 43)
    Mutation(
        "Quark: gradients no longer clipped at --max-grad-norm",
        "farmkit/methods/quark.py",
        "accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)",
        "pass",
        ("tests/methods/test_quark.py::test_gradients_are_clipped_at_the_configured_norm",),
    ),
    Mutation(
        "-q: library warnings no longer silenced",
        "farmkit/cli.py",
        '        warnings.simplefilter("ignore")',
        "        pass",
        (
            "tests/tools/test_contract.py::test_quiet_silences_library_warnings",
            "tests/tools/test_contract.py::test_quiet_silences_a_warning_raised_while_a_real_tool_trains",
        ),
        fast=True,
    ),
    # --- issue 45: the board across a judge's retirement, AlpacaEval's evaluators table
    Mutation(
        "--old-judge: length-controlled win rate without the rectifier (the new judge's own)",
        "farmkit/evaluate/length_control.py",
        "numerator = lam * judge + boost * (label - lam * judge)",
        "numerator = lam * judge + boost * (judge - lam * judge)",
        (
            "tests/evaluate/test_board_stats.py::test_old_judge_length_controlled_win_rate_is_carried_across",
        ),
    ),
    Mutation(
        "farm-correlate --format alpaca-eval: lists by the strict line detector",
        "farmkit/evaluate/correlate.py",
        "self.list_detector = list_detector or contains_list",
        "self.list_detector = contains_list",
        (
            "tests/evaluate/test_winrate_alpaca_eval.py::test_the_evaluators_table_counts_lists_with_alpaca_evals_detector",
        ),
    ),
]


def copy_tree(destination: Path) -> None:
    """The working tree as it is (committed or not), without virtual environments or git."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for relative in listed:
        source = ROOT / relative
        if source.is_file():
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def apply(mutation: Mutation, tree: Path) -> str | None:
    """Apply the mutation in `tree`; an error message when its old text is not there exactly once."""
    path = tree / mutation.file
    if not path.exists():
        return f"{mutation.file} does not exist"
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        return f"old text found {count} times in {mutation.file}"
    path.write_text(text.replace(mutation.old, mutation.new))
    return None


def run_tests(
    tree: Path, tests: list[str], stop_first: bool, markers: str = "slow or not slow"
) -> tuple[int, list[str], str]:
    """(pytest's exit status, the failed test ids, the output's tail) of `tests` in `tree`, with the
    copy's farmkit first on the path (the installed console scripts import it too)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "FARMKIT_SHARED_DATA": os.environ.get(
            "FARMKIT_SHARED_DATA", str(ROOT.parent / "shared" / "data")
        ),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider"]
    command += ["-m", markers, *(["-x"] if stop_first else []), *tests]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    output = done.stdout + done.stderr
    failed = re.findall(r"^FAILED (\S+)", output, flags=re.MULTILINE)
    return done.returncode, failed, output[-3000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="only the CI subset")
    parser.add_argument("--only", action="append", default=[], help="a mutation's name (repeat)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    options = parser.parse_args()

    chosen = [m for m in MUTATIONS if (m.fast or not options.fast)]
    if options.only:
        unknown = set(options.only) - {m.name for m in MUTATIONS}
        if unknown:
            parser.error(f"unknown mutation(s): {sorted(unknown)}")
        chosen = [m for m in chosen if m.name in options.only]
    if options.list:
        for mutation in chosen:
            print(f"{'fast' if mutation.fast else '    '}  {mutation.name}  ({mutation.file})")
        return 0

    rows: list[tuple[str, str, str]] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="farm-mutants-") as scratch:
        pristine = Path(scratch) / "pristine"
        copy_tree(pristine)
        if not options.no_baseline:
            tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
            started = time.perf_counter()
            status, failed, tail = run_tests(pristine, tests, stop_first=False)
            seconds = time.perf_counter() - started
            print(f"baseline: {len(tests)} tests, exit {status}, {seconds:.0f} s", flush=True)
            if status != 0:
                print(tail)
                print("the named tests must pass on the unmutated code", file=sys.stderr)
                return 1
        for mutation in chosen:
            tree = Path(scratch) / "mutant"
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(pristine, tree)
            problem = apply(mutation, tree)
            if problem:
                ok = False
                rows.append((mutation.name, "ERROR", problem))
                print(f"{mutation.name}: {problem}", flush=True)
                continue
            started = time.perf_counter()
            status, failed, tail = run_tests(tree, list(mutation.tests), stop_first=True)
            seconds = time.perf_counter() - started
            if status == 1 and failed:
                rows.append((mutation.name, "yes", f"{failed[0]} ({seconds:.0f} s)"))
            else:
                ok = False
                why = "survived" if status == 0 else f"pytest exit {status}, no test failed"
                rows.append((mutation.name, "NO", f"{why} ({seconds:.0f} s)"))
                if status != 0:
                    print(tail)
            print(f"{mutation.name}: {rows[-1][1]} {rows[-1][2]}", flush=True)

    width = max(len(name) for name, _, _ in rows) if rows else 10
    print()
    print(f"{'mutation':<{width}}  caught  by")
    for name, caught, by in rows:
        print(f"{name:<{width}}  {caught:<6}  {by}")
    caught = sum(1 for _, c, _ in rows if c == "yes")
    print(f"\n{caught} of {len(rows)} mutations caught")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
