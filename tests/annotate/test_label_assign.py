"""farm-label's assignment (AlpacaFarm's: each pair to one annotator, an overlap to all, checks in
every queue) and the mapping of a left/right answer back to output_1/output_2."""

from __future__ import annotations

from collections import Counter

import pytest

from farmkit.annotate.label import parse_annotators
from farmkit.annotate.label.assign import CHOICES, assign, verdict

NAMES = ("alice", "bob", "carol")


def test_each_pair_goes_to_exactly_one_annotator_in_balanced_queues():
    queues = assign(50, 0, NAMES, 0.0, seed=3).queues
    counts = Counter(item for queue in queues.values() for item in queue)
    assert sorted(counts) == sorted(f"p{index}" for index in range(50))
    assert set(counts.values()) == {1}
    sizes = sorted(len(queue) for queue in queues.values())
    assert sizes == [16, 17, 17]


def test_the_overlap_goes_to_every_annotator_and_the_rest_to_one():
    queues = assign(40, 0, NAMES, 0.25, seed=0).queues
    counts = Counter(item for queue in queues.values() for item in queue)
    shared = {item for item, count in counts.items() if count == 3}
    assert len(shared) == 10  # round(0.25 * 40)
    assert set(counts.values()) == {1, 3} and len(counts) == 40
    assert all(shared <= set(queue) for queue in queues.values())
    own = sorted(len(queue) - len(shared) for queue in queues.values())
    assert own == [10, 10, 10]


def test_checks_are_in_every_queue_at_seeded_places_and_the_order_is_shuffled():
    queues = assign(30, 4, NAMES, 0.0, seed=1).queues
    for queue in queues.values():
        assert sorted(item for item in queue if item.startswith("c")) == ["c0", "c1", "c2", "c3"]
    places = [
        tuple(i for i, item in enumerate(queue) if item.startswith("c"))
        for queue in queues.values()
    ]
    assert len(set(places)) > 1  # each annotator's checks sit elsewhere
    pairs = [item for item in queues["alice"] if item.startswith("p")]
    assert pairs != sorted(pairs, key=lambda item: int(item[1:]))


def test_the_same_arguments_give_the_same_assignment_and_another_seed_another():
    first = assign(25, 2, NAMES, 0.2, seed=7)
    again = assign(25, 2, NAMES, 0.2, seed=7)
    other = assign(25, 2, NAMES, 0.2, seed=8)
    assert first.queues == again.queues
    assert first.queues != other.queues
    shown = [first.swapped("alice", f"p{index}") for index in range(25)]
    assert shown == [again.swapped("alice", f"p{index}") for index in range(25)]
    assert 5 < sum(shown) < 20  # a coin per item, not one side for all
    assert shown != [first.swapped("bob", f"p{index}") for index in range(25)]


@pytest.mark.parametrize(
    ("choice", "swapped", "expected"),
    [
        ("A_much", False, (1, "much")),
        ("A_much", True, (2, "much")),
        ("A_slightly", True, (2, "slightly")),
        ("B_slightly", False, (2, "slightly")),
        ("B_much", True, (1, "much")),
        ("tie", True, (1.5, None)),
        ("tie", False, (1.5, None)),
    ],
)
def test_a_choice_maps_back_from_left_and_right_to_output_1_and_output_2(choice, swapped, expected):
    assert verdict(choice, swapped) == expected


def test_the_five_choices_in_the_page_s_order():
    assert CHOICES == ("A_much", "A_slightly", "tie", "B_slightly", "B_much")


def test_annotators_are_names_or_a_count():
    assert parse_annotators("alice,bob") == ("alice", "bob")
    assert parse_annotators("3") == ("annotator-1", "annotator-2", "annotator-3")
    for bad, message in [
        ("0", "at least one"),
        ("alice,alice", "twice"),
        ("a b", "not an annotator"),
        ("alice,status", "'status' names the organiser's link"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_annotators(bad)
