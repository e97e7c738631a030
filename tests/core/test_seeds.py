"""farmkit.core.seeds: one home for derived seeds and stable hashes. The values tools already wrote stay
what they were (farm-sample's per-request seeds, farm-split's positions, provenance config hashes):
golden numbers computed with the formulas these functions replaced."""

from __future__ import annotations

import pytest

from farmkit.core import seeds


def test_derived_seeds_and_positions_keep_their_published_values():
    from farmkit.core.provenance import config_hash
    from farmkit.core.split import position
    from farmkit.lm.sampling import request_seed

    assert [request_seed(s, i, k) for s, i, k in [(0, 0, 0), (7, 3, 1), (123, 4567, 15)]] == [
        1428933352,
        112770210,
        1425679864,
    ]
    assert [position(k, s) for k, s in [("a\x00", 0), ("Name a colour.\x00", 42)]] == [
        0.1449752279624332,
        0.2624676327247691,
    ]
    assert (
        config_hash({"b": 1, "a": [1, 2]})
        == "94a786c3662b"
        == seeds.stable_hash({"a": [1, 2], "b": 1})[:12]
    )


def test_derived_seeds_differ_by_purpose_and_do_not_collide_with_the_next_seed():
    rounds = [seeds.derive_seed(0, "round", number) for number in range(1, 6)]
    assert len(set(rounds)) == 5 and all(0 <= value < 2**31 for value in rounds)
    assert seeds.derive_seed(0, "round", 2) != seeds.derive_seed(1, "round", 1)
    assert seeds.derive_seed(0, "round", 2) == seeds.derive_seed(0, "round", 2)
    assert (
        seeds.unit_interval(3, "x") == pytest.approx(seeds.unit_interval(3, "x"))
        and 0 <= seeds.unit_interval(3, "x") < 1
    )


def test_farmkit_derives_its_seeds_in_one_place():
    """Every seed farmkit draws from comes from farmkit.core.seeds.derive_seed: arithmetic such as
    `seed * 1_000_003 + round * 1_009 + start` makes two purposes (round 1 at 1009, round 2 at 0)
    or two runs share one random stream. Every module of the package (methods, generation,
    annotation, ...) and of the command-line tools is scanned."""
    import re

    from conftest import ROOT

    arithmetic = re.compile(r"\bseed\s*[*+]|[*+]\s*seed\b")
    files = sorted([*(ROOT / "farmkit").rglob("*.py"), *(ROOT / "tools").rglob("*.py")])
    assert any(path.name == "generation.py" for path in files)
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if arithmetic.search(line)
    ]
    assert found == []
