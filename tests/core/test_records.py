"""farmkit.core.records: preference records read as comparisons, and the one check of a record's
texts (core.records.pair_texts) that reward-model training and the learned judges share."""

from __future__ import annotations

import pytest

from farmkit.annotate.validation import records_pairs
from farmkit.core.io import RecordError
from farmkit.core.records import comparisons

GOOD = {"instruction": "Name a colour.", "output_1": "red", "output_2": "blue", "preference": 2}
# AlpacaEval's compact annotations keep the outputs' lengths, not their texts
COMPACT = {"instruction": "Name a colour.", "instruction_index": 3, "preference": 1.0}


def test_comparisons_read_the_texts_and_the_target():
    kept, counts = comparisons([GOOD, {**GOOD, "preference": None}], "prefs.jsonl")
    assert [(c.output_1, c.output_2, c.target, c.input) for c in kept] == [("red", "blue", 1.0, "")]
    assert counts == {"used": 1, "null": 1}


@pytest.mark.parametrize(
    "read",
    [
        lambda rows: comparisons(rows, "prefs.jsonl"),
        lambda rows: records_pairs(enumerate(rows, start=1), "prefs.jsonl"),
    ],
    ids=["comparisons", "records_pairs"],
)
def test_a_record_without_output_texts_names_its_line(read):
    with pytest.raises(RecordError) as caught:
        read([GOOD, COMPACT])
    assert str(caught.value) == (
        "prefs.jsonl:2: the preference has no output texts; expected output_1 and output_2"
    )
