"""Who labels what, in which order, and which output is shown on the left: AlpacaFarm's assignment
(each pair to one annotator, a fraction of them to every annotator for agreement) with known-answer
checks mixed into every queue. Every draw is seeded, so the same arguments give the same queues after
a restart."""

from __future__ import annotations

import random
from dataclasses import dataclass

from farmkit.core.seeds import derive_seed, unit_interval


def pair_id(index: int) -> str:
    return f"p{index}"


def check_id(index: int) -> str:
    return f"c{index}"


@dataclass(frozen=True)
class Assignment:
    queues: dict[str, list[str]]  # annotator -> item ids, in the order they are shown
    seed: int

    def swapped(self, annotator: str, item_id: str) -> bool:
        """Whether output_2 is shown on the left for this annotator and item (a seeded coin)."""
        return unit_interval(self.seed, "farm-label shown", annotator, item_id) < 0.5


def assign(
    n_pairs: int,
    n_checks: int,
    annotators: tuple[str, ...],
    overlap: float,
    seed: int,
    ordered: bool = False,
) -> Assignment:
    """Deal `n_pairs` pairs: round(overlap * n_pairs) of them, drawn at random, to every annotator,
    the others dealt out so that queue sizes differ by at most one; then each queue is shuffled and
    every check is put in it at a seeded place. `ordered`: the pairs are in the order they should be
    labelled (farm-label --judge: the most informative first), so nothing is shuffled and the first
    round(overlap * n_pairs) are the shared ones."""
    order = list(range(n_pairs))
    if not ordered:
        random.Random(derive_seed(seed, "farm-label pairs")).shuffle(order)
    shared = order[: round(overlap * n_pairs)]
    own: dict[str, list[int]] = {name: list(shared) for name in annotators}
    for position, index in enumerate(order[len(shared) :]):
        own[annotators[position % len(annotators)]].append(index)
    queues = {}
    for name in annotators:
        draw = random.Random(derive_seed(seed, "farm-label queue", name))
        queue = [pair_id(index) for index in own[name]]
        if not ordered:
            draw.shuffle(queue)
        for index in range(n_checks):
            queue.insert(draw.randint(0, len(queue)), check_id(index))
        queues[name] = queue
    return Assignment(queues, seed)


# the five answers, as the page's buttons name them: A is the output shown on the left, B the right
CHOICES = ("A_much", "A_slightly", "tie", "B_slightly", "B_much")
# what else an annotator may do with a pair, none of it a label (preference null): skip it for now
# (it comes back after the rest of their queue), or flag it as one they cannot judge or as a problem
# (a broken pair, harmful content; their comment says what), which ends it as a label would
SKIP = "skip"
FLAGS = ("cant_judge", "problem")
ACTIONS = (*CHOICES, SKIP, *FLAGS)


def verdict(choice: str, swapped: bool) -> tuple[float, str | None]:
    """(preference, strength) of a choice on an item shown with output_2 on the left when `swapped`:
    1 output_1 better, 2 output_2 better, 1.5 a tie (whose strength is None)."""
    if choice == "tie":
        return 1.5, None
    left_better = choice.startswith("A_")
    return (2 if left_better == swapped else 1), choice.split("_", 1)[1]
