"""Audit of the mutation gate with fresh mutations: breaks of the same methods that dev/mutants.py
does not list (and that no test was written against), each applied alone to a copy of the working
tree, with the tests of its area run there. Run it with the tests of another commit (--tests-from,
e.g. the one before the gate) to compare. Not part of the test suite.

    python bench/audit_mutants.py [--tests-from REF] [--only NAME ...]

Prints one line per mutation (caught or not, by which test) and the count caught.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutants import ROOT, Mutation, apply, copy_tree, run_tests  # noqa: E402

# (mutation, test files, -k expression or None): the same selection runs whatever the tests' commit
FRESH: list[tuple[Mutation, tuple[str, ...], str | None]] = [
    (
        Mutation(
            "generate: temperature floored at 1",
            "farmkit/lm/generation.py",
            "kwargs.update(temperature=config.temperature,",
            "kwargs.update(temperature=max(config.temperature, 1.0),",
            (),
        ),
        (
            "tests/lm/test_sampling.py",
            "tests/methods/test_bon.py",
            "tests/lm/test_generation_temperature.py",
        ),
        None,
    ),
    (
        Mutation(
            "log-probs: logits divided by the square root of the temperature",
            "farmkit/train/policy.py",
            "return out.logits[:, :-1].float() / temperature",
            "return out.logits[:, :-1].float() / temperature**0.5",
            (),
        ),
        ("tests/train/test_rollouts.py", "tests/lm/test_generation_temperature.py"),
        None,
    ),
    (
        Mutation(
            "GRPO: divided by the group's variance, not its std",
            "farmkit/train/estimators.py",
            "centred = centred / (grouped.std(dim=1, keepdim=True) + eps)",
            "centred = centred / (grouped.var(dim=1, keepdim=True) + eps)",
            (),
        ),
        ("tests/methods/test_group.py",),
        "not test_cli and not resume and not rises and not groups_are",
    ),
    (
        Mutation(
            "GRPO/RLOO: clip range doubled",
            "farmkit/methods/group.py",
            "prepared.advantages, config.clip_range, config.max_new_tokens",
            "prepared.advantages, 2 * config.clip_range, config.max_new_tokens",
            (),
        ),
        ("tests/methods/test_group.py",),
        "not test_cli and not resume and not rises and not groups_are",
    ),
    (
        Mutation(
            "GRPO: KL coefficient in the loss halved",
            "farmkit/methods/group.py",
            "loss = loss + config.kl_coef * kl_loss",
            "loss = loss + 0.5 * config.kl_coef * kl_loss",
            (),
        ),
        ("tests/methods/test_group.py",),
        "not test_cli and not resume and not rises and not groups_are",
    ),
    (
        Mutation(
            "Quark --keep all: every quantile behind the worst token",
            "farmkit/methods/quark.py",
            "[ids + token_ids[q : q + 1] for ids, (_, q) in zip(prompt_ids, local, strict=True)],",
            "[ids + token_ids[-1:] for ids, (_, q) in zip(prompt_ids, local, strict=True)],",
            (),
        ),
        ("tests/methods/test_quark.py",),
        "keep_all or later_rounds",
    ),
    (
        Mutation(
            "Quark: later rounds behind the second quantile's token",
            "farmkit/methods/quark.py",
            "control = token_ids[:1] if round_number > 0 and tokens else []",
            "control = token_ids[1:2] if round_number > 0 and tokens else []",
            (),
        ),
        ("tests/methods/test_quark.py",),
        "keep_all or later_rounds",
    ),
    (
        Mutation(
            "DPO: loss weights not passed to TRL",
            "farmkit/methods/dpo.py",
            "loss_weights=config.weights,",
            "",
            (),
        ),
        ("tests/methods/test_dpo.py",),
        "loss_variants",
    ),
    (
        Mutation(
            "SFT: the prompt's last token trained on",
            "farmkit/methods/sft.py",
            "mask = ([0] * len(prompt_ids) + [1] * len(completion_ids))[:max_length]",
            "mask = ([0] * (len(prompt_ids) - 1) + [1] * (len(completion_ids) + 1))[:max_length]",
            (),
        ),
        ("tests/methods/test_sft.py",),
        "lowers_the_response_loss or prompt_tokens",
    ),
    (
        Mutation(
            "PPO: advantages scaled but not centred",
            "farmkit/train/estimators.py",
            "return rl_common.masked_whiten(advantages, mask, reduce=reduce), returns",
            "return rl_common.masked_whiten(advantages, mask, False, reduce=reduce), returns",
            (),
        ),
        ("tests/train/test_estimators.py",),
        None,
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests-from", help="a git ref whose tests/ replaces the working tree's")
    parser.add_argument("--only", action="append", default=[], help="a mutation's name (repeat)")
    options = parser.parse_args()
    fresh = [entry for entry in FRESH if not options.only or entry[0].name in options.only]
    caught = 0
    with tempfile.TemporaryDirectory(prefix="farm-audit-mutants-") as scratch:
        pristine = Path(scratch) / "pristine"
        copy_tree(pristine)
        if options.tests_from:
            shutil.rmtree(pristine / "tests")
            archive = subprocess.run(
                ["git", "archive", options.tests_from, "tests"],
                cwd=ROOT,
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(pristine)], input=archive, check=True)
        for mutation, files, keyword in fresh:
            tree = Path(scratch) / "mutant"
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(pristine, tree)
            problem = apply(mutation, tree)
            if problem:
                print(f"ERROR  {mutation.name}: {problem}", flush=True)
                continue
            present = [f for f in files if (tree / f).exists()]
            args = [*present, *(["-k", keyword] if keyword else [])]
            started = time.perf_counter()
            status, failed, tail = run_tests(tree, args, True, "not slow and not recipe")
            seconds = time.perf_counter() - started
            if status == 1 and failed:
                caught += 1
                print(f"caught    {mutation.name}: {failed[0]} ({seconds:.0f} s)", flush=True)
            else:
                print(
                    f"SURVIVED  {mutation.name}: pytest exit {status} ({seconds:.0f} s)", flush=True
                )
                if status not in (0, 1):
                    print(tail[-1500:])
    print(f"\n{caught} of {len(fresh)} fresh mutations caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
