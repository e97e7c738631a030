"""Win rates against a reference from preference records, in one streaming pass.

AlpacaEval's leaderboard figures (reproduced exactly from its published annotations):
    x = preference - 1 for the model in position 2 (1 -> 0, 2 -> 1, 1.5 and the legacy 0 -> 0.5,
        fractional preferences count fractionally); null verdicts are dropped and counted
    win_rate = 100 * mean(x);  standard_error = 100 * sd(x, ddof=1) / sqrt(n)
    n_wins = #(x > 0.5), n_losses = #(x < 0.5) (AlpacaEval's n_wins_base), n_draws = #(x == 0.5)
    discrete_win_rate = 100 * (n_wins + n_draws / 2) / n_total
    avg_length = floor of the mean length (characters) of the model's outputs, null verdicts included

Records are read, checked and folded CHUNK at a time (the sums taken with numpy): each (reference,
model) keeps running sums, plus a bounded histogram of bootstrap values (1e-4 grid) when asked for.
Length control keeps five numbers per verdict, 28 bytes (the regression needs them all); the detection of
repeated verdicts keeps a byte per (model, instruction); `--compare` keeps one value per item for the
two models compared. Without length control, memory grows with the models and instructions, not
with the records.

The length-controlled win rate (AlpacaEval 2's GLM) is defined in farmkit/evaluate/length_control.py.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from farmkit.core.fields import help_field
from farmkit.core.io import FarmError, RecordError, bad_records, display_name, iter_json_chunks
from farmkit.core.validate import first_invalid, problems
from farmkit.core.values import NON_NEGATIVE, Bounds
from farmkit.evaluate.boards import BOARD_FORMATS
from farmkit.evaluate.length_control import (
    NO_LENGTH_CONTROL,
    NO_PPI_LENGTH_CONTROL,
    board_fits,
    is_extreme_change,
    ppi_length_controlled,
)
from farmkit.evaluate.ppi import PairLedger, labels_for_se, rank_sets, slot_values
from farmkit.train.config import shared_field

VALUE_GRID = 10_000  # bootstrap histogram resolution of x
CHUNK = 16_384  # records read, checked and folded at a time (bounds the memory used)


@dataclass
class Tally:
    """Running sums for one model against one reference."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    wins: int = 0
    losses: int = 0
    draws: int = 0
    dropped: int = 0
    length_sum: int = 0
    length_n: int = 0
    values: np.ndarray | None = None  # (VALUE_GRID + 1, 2): count, sum of x


def item_key(record: dict[str, Any]) -> Any:
    """What identifies the instruction a verdict is about: id, instruction_index, or the texts; None
    when the record has none of them."""
    for name in ("id", "instruction_index"):
        if record.get(name) is not None:
            return record[name]
    if record.get("instruction") is None:
        return None
    return (record["instruction"], record.get("input") or "")


def _lengths(record: dict[str, Any]) -> tuple[float, float]:
    """(length of output_1, length of output_2) in characters: len_1/len_2 or the texts; NaN if unknown."""
    first, second = record.get("len_1"), record.get("len_2")
    if type(first) is int and type(second) is int:
        return first, second
    lengths = []
    for position, given in (("1", first), ("2", second)):
        if type(given) is int:
            lengths.append(given)
        else:
            text = record.get(f"output_{position}")
            lengths.append(len(text) if isinstance(text, str) else math.nan)
    return lengths[0], lengths[1]


class InvalidRecord(ValueError):
    """A record that the schema accepts but farm-winrate cannot count; line is its line in its file."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


def win_values(records: Sequence[dict[str, Any]], numbers: Sequence[int]) -> np.ndarray:
    """Each record's x, the win value of position 2 (NaN: a null verdict); InvalidRecord names the
    first preference outside the scale."""
    preference = np.array([record.get("preference") for record in records], dtype=np.float64)
    out_of_range = ~np.isnan(preference) & (preference != 0) & ((preference < 1) | (preference > 2))
    if out_of_range.any():
        i = int(np.argmax(out_of_range))
        raise InvalidRecord(
            numbers[i],
            f"preference {records[i]['preference']!r} is outside [1, 2]; expected 1, 2, 1.5 (tie), "
            "a value in between, 0 (AlpacaEval's legacy tie) or null",
        )
    return np.where(preference == 0, 0.5, preference - 1.0)


class WinrateTable:
    """Accumulates preference records into one tally per (reference, model).

    reference: orient every record so that this system is the reference (records that do not
    involve it are skipped and counted); swap: treat position 1 as the model for every record;
    otherwise position 2 is the model and position 1 its reference. compare: pairs of models whose
    per-item verdicts are kept for a paired comparison. dedupe: count only the first verdict on each
    instruction per (reference, model); the repeats are counted in `duplicates` either way.
    difficulty: instruction difficulties by item key (see `read_instruction_difficulty`), instead of
    estimating them from the input. humans: keep each pair's simulated verdicts, for human labels
    (`add_human_file`) and the prediction-powered win rates (farmkit/evaluate/ppi.py). keep_items:
    keep every model's per-item verdicts (as compare does for its models), for --baseline and --plan.
    """

    def __init__(
        self,
        reference: str | None = None,
        swap: bool = False,
        bootstrap: bool = False,
        length_control: bool = True,
        compare: Sequence[tuple[str, str]] = (),
        dedupe: bool = False,
        difficulty: tuple[str, dict[Any, float]] | None = None,
        humans: bool = False,
        keep_items: bool = False,
    ):
        self.reference, self.swap = reference, swap
        self.bootstrap, self.length_control, self.dedupe = bootstrap, length_control, dedupe
        self.difficulty = difficulty
        self.tallies: dict[tuple[str, str], Tally] = {}
        self.skipped = 0
        self.duplicates: dict[
            tuple[Any, Any], list[Any]
        ] = {}  # (reference, model) -> [count, first FILE:LINE]
        self.lc_notes: list[str] = []  # how each reference's instruction difficulties were obtained
        self._lc_difficulty: dict[str, np.ndarray | None] = {}  # and they, by item index
        self._lc_penalty: dict[int, float] = {}  # slot -> the C its length-controlled fit chose
        self._slots: dict[tuple[Any, Any], int] = {}  # (reference, model) -> index of its sums
        self._by_model: dict[Any, dict[Any, int]] = {}  # the same, by reference then model
        self._items: dict[Any, int] = {}  # item key -> index
        self._seen = np.zeros((0, 0), dtype=bool)  # [slot, item]: a verdict was counted
        # per chunk, what the length-controlled estimate needs of each usable verdict: slot and item
        # (int32), len_model - len_reference and x (float64), its pair in `pairs` (int32, -1 without
        # humans); 28 bytes a verdict
        self._verdicts: list[tuple[np.ndarray, ...]] = []
        self.items: dict[str, dict[Any, list[float]]] = {
            name: {} for pair in compare for name in pair
        }
        self.keep_items = keep_items
        self._annotators: dict[int, set[str]] = {}  # slot -> the records' `annotator` names
        # (results_dir, model) -> [count, first FILE:LINE]: AlpacaEval rows whose results folder is
        # another system's (an upstream copy, or a folder holding a renamed generator)
        self.misfiled: dict[tuple[str, Any], list[Any]] = {}
        self.pairs = PairLedger(item_key) if humans else None

    def add_records(
        self,
        records: list[dict[str, Any]],
        source: str = "records",
        numbers: Sequence[int] | None = None,
    ) -> None:
        """Count a list of (schema-checked) preference records; InvalidRecord names the first bad one.
        source, numbers: the file and each record's line, for the report of repeated verdicts.

        Per record, only the fields used are gathered into lists; the sums are taken with numpy."""
        numbers = list(numbers) if numbers is not None else list(range(1, len(records) + 1))
        first = [record.get("generator_1") for record in records]
        second = [record.get("generator_2") for record in records]
        if self.reference is not None:
            involved = [
                i
                for i, (a, b) in enumerate(zip(first, second, strict=True))
                if self.reference in (a, b)
            ]
            self.skipped += len(records) - len(involved)
            if len(involved) < len(records):
                records, numbers = [records[i] for i in involved], [numbers[i] for i in involved]
                first, second = [first[i] for i in involved], [second[i] for i in involved]
            flips = np.array([a != self.reference for a in first], dtype=bool)
            references = [self.reference] * len(records)
            models = [
                a if flip else b for a, b, flip in zip(first, second, flips.tolist(), strict=True)
            ]
        else:
            flips = np.full(len(records), self.swap)
            references, models = (second, first) if self.swap else (first, second)
        distinct = set(references)
        if len(distinct) == 1:  # the usual case: one reference, look models up by name alone
            slots = list(map(self._by_model.setdefault(distinct.pop(), {}).get, models))
        else:
            slots = list(map(self._slots.get, zip(references, models, strict=True)))
        if None in slots:
            for i, slot in enumerate(slots):
                if models[i] is None:
                    raise InvalidRecord(
                        numbers[i],
                        "no generator_2 to rank; expected generator_1 (the reference) and generator_2 (the model)",
                    )
                if slot is None:
                    slots[i] = self._slot(references[i], models[i])
        self._note_misfiled(records, models, source, numbers)
        slots_array, items = np.array(slots, dtype=np.int64), self._item_indices(records)
        kept = self._note_repeats(slots_array, items, source, numbers)
        if kept is not None:
            records, models, numbers = (
                [values[i] for i in kept] for values in (records, models, numbers)
            )
            slots_array, items, flips = slots_array[kept], items[kept], flips[kept]
        x = win_values(records, numbers)
        if self.swap or self.reference is not None:
            x = np.where(flips, 1.0 - x, x)
        lengths_1 = [record.get("len_1") for record in records]
        lengths_2 = [record.get("len_2") for record in records]
        if set(map(type, lengths_1)) | set(map(type, lengths_2)) <= {int}:
            lengths = np.array([lengths_1, lengths_2], dtype=np.float64).T.reshape(len(records), 2)
        else:
            lengths = np.array([_lengths(record) for record in records], dtype=np.float64).reshape(
                len(records), 2
            )
        if self.swap or self.reference is not None:
            lengths = np.where(flips[:, None], lengths[:, ::-1], lengths)
        self._fold(slots_array, x, lengths[:, 1])
        pairs = np.full(len(records), -1, dtype=np.int64)
        if self.pairs is not None:
            pairs[:] = self.pairs.add_simulated(
                records, slots_array.tolist(), x, flips, list(self._slots)
            )
        self._note_annotators(records, slots_array)
        if self.length_control:
            usable = ~np.isnan(x) & ~np.isnan(lengths).any(axis=1)
            self._verdicts.append(
                (
                    slots_array[usable].astype(np.int32),
                    items[usable].astype(np.int32),
                    lengths[usable, 1] - lengths[usable, 0],
                    x[usable],
                    pairs[usable].astype(np.int32),
                )
            )
        for i, model in enumerate(models if self.items or self.keep_items else ()):
            if (self.keep_items or model in self.items) and x[i] == x[i]:
                cell = self.items.setdefault(model, {}).setdefault(item_key(records[i]), [0.0, 0.0])
                cell[0] += 1
                cell[1] += float(x[i])

    def _note_misfiled(
        self, records: list[dict[str, Any]], models: list[Any], source: str, numbers: list[int]
    ) -> None:
        """Count the records whose AlpacaEval `results_dir` names another system than the model."""
        folders = [record.get("results_dir") for record in records]
        if not any(folders):
            return
        for folder, model, number in zip(folders, models, numbers, strict=True):
            if folder is not None and folder != model:
                self.misfiled.setdefault((str(folder), model), [0, f"{source}:{number}"])[0] += 1

    def _note_annotators(self, records: list[dict[str, Any]], slots: np.ndarray) -> None:
        names = [
            record.get("annotator") for record in records
        ]  # the schema has them strings or absent
        if len(set(names)) == 1:  # the usual case: one judge for the whole chunk
            pairs = {(slot, names[0]) for slot in np.unique(slots).tolist()}
        else:
            pairs = set(zip(slots.tolist(), names, strict=True))
        for slot, name in pairs:
            if name is not None:
                self._annotators.setdefault(slot, set()).add(name)

    def annotator(self, reference: str, model: str) -> str | None:
        """The judges of a (reference, model)'s verdicts, from the records' `annotator` field."""
        names = self._annotators.get(self._slots.get((reference, model), -1))
        return ", ".join(sorted(names)) if names else None

    def _item_indices(self, records: list[dict[str, Any]]) -> np.ndarray:
        """The index of each record's instruction (see `item_key`), -1 for a record without one."""
        keys = [record.get("instruction_index") for record in records]
        if None in keys or any("id" in record for record in records):
            keys = [item_key(record) for record in records]
        for key in dict.fromkeys(keys):
            if key is not None and key not in self._items:
                self._items[key] = len(self._items)
        return np.array([-1 if key is None else self._items[key] for key in keys], dtype=np.int64)

    def _note_repeats(
        self, slots: np.ndarray, items: np.ndarray, source: str, numbers: list[int]
    ) -> np.ndarray | None:
        """Count the verdicts on an instruction a (reference, model) already had; with dedupe, the
        indices of the records to keep (None: keep all)."""
        identified = np.flatnonzero(items >= 0)
        if not len(identified):
            return None
        slot, item = slots[identified], items[identified]
        rows, columns = self._seen.shape
        if slot.max() >= rows or item.max() >= columns:  # grow by doubling: amortized copies
            grown = np.zeros(
                (max(2 * rows, slot.max() + 1), max(2 * columns, item.max() + 1)), dtype=bool
            )
            grown[:rows, :columns] = self._seen
            self._seen = grown
        repeated = self._seen[slot, item]
        codes = (slot << 32) | item
        order = np.argsort(codes, kind="stable")
        repeated[order[1:][codes[order][1:] == codes[order][:-1]]] = True  # again within this chunk
        self._seen[slot, item] = True
        if not repeated.any():
            return None
        positions = identified[repeated]
        names = list(self._slots)
        counts = np.bincount(slots[positions])
        for slot, at in zip(*np.unique(slots[positions], return_index=True), strict=True):
            entry = self.duplicates.setdefault(
                names[slot], [0, f"{source}:{numbers[positions[at]]}"]
            )
            entry[0] += int(counts[slot])
        return np.setdiff1d(np.arange(len(items)), positions) if self.dedupe else None

    def _slot(self, reference: Any, model: Any) -> int:
        slot = self._slots.get((reference, model))
        if slot is None:
            slot = self._slots[(reference, model)] = len(self._slots)
            self._by_model.setdefault(reference, {})[model] = slot
        return slot

    def _fold(self, slots: np.ndarray, x: np.ndarray, lengths: np.ndarray) -> None:
        """Add one chunk (slot, verdict x or NaN, model length or NaN per record) to the running sums."""
        size = len(self._slots)
        keys = list(self._slots)
        while len(self.tallies) < size:
            reference, model = keys[len(self.tallies)]
            self.tallies[(reference or "", model)] = Tally()
        tallies = list(self.tallies.values())
        valid = ~np.isnan(x)
        kept, values = slots[valid], x[valid]
        has_length = ~np.isnan(lengths)
        columns = {
            "n": np.bincount(kept, minlength=size),
            "total": np.bincount(kept, weights=values, minlength=size),
            "total_sq": np.bincount(kept, weights=values * values, minlength=size),
            "wins": np.bincount(kept[values > 0.5], minlength=size),
            "losses": np.bincount(kept[values < 0.5], minlength=size),
            "draws": np.bincount(kept[values == 0.5], minlength=size),
            "dropped": np.bincount(slots[~valid], minlength=size),
            "length_sum": np.bincount(
                slots[has_length], weights=lengths[has_length], minlength=size
            ),
            "length_n": np.bincount(slots[has_length], minlength=size),
        }
        for name, column in columns.items():
            for index in np.flatnonzero(column):
                tally = tallies[index]
                value = column[index]
                setattr(
                    tally,
                    name,
                    getattr(tally, name)
                    + (float(value) if name.startswith("total") else int(round(value))),
                )
        if self.bootstrap:
            bins = np.rint(values * VALUE_GRID).astype(np.int64)
            _histogram(tallies, "values", kept * (VALUE_GRID + 1) + bins, VALUE_GRID + 1, [values])

    def add_file(self, path: str) -> None:
        """Read and count every record of a file (JSONL, JSON array, .gz, `-`), a chunk at a time."""
        name = display_name(path)
        for numbers, records in _checked_chunks(path, name):
            try:
                self.add_records(records, name, numbers)
            except InvalidRecord as exc:
                raise RecordError(name, exc.line, exc.message) from None

    def add_human_file(self, path: str, include_screened: bool = False) -> int:
        """Read human labels on pairs of the simulated verdicts already added (humans=True); a label
        whose pair is not among them is a RecordError naming its line. Labels marked screened_out
        (farm-label --min-check-score) are left out unless `include_screened`; returns how many."""
        name = display_name(path)
        screened = 0
        for numbers, records in _checked_chunks(path, name):
            if not include_screened:
                kept = [
                    (record, number)
                    for record, number in zip(records, numbers, strict=True)
                    if not (isinstance(record, dict) and record.get("screened_out") is True)
                ]
                screened += len(records) - len(kept)
                records, numbers = [r for r, _ in kept], [n for _, n in kept]
                if not records:
                    continue
            try:
                values = win_values(records, numbers).tolist()
            except InvalidRecord as exc:
                raise RecordError(name, exc.line, exc.message) from None
            for record, number, value in zip(records, numbers, values, strict=True):
                try:
                    self.pairs.add_human(record, value)
                except ValueError as exc:
                    raise RecordError(
                        name, number, f"a human label on no simulated pair: {exc}"
                    ) from None
        return screened

    def self_judged(self) -> list[tuple[str, Tally]]:
        """(model, tally) of each model judged against itself: no ranking, only position bias."""
        return [
            (model, tally)
            for (reference, model), tally in self.tallies.items()
            if reference == model
        ]

    def rows(
        self,
        seed: int = 0,
        resamples: int = 1000,
        confidence: float = 0.95,
        sort_by: str = "win_rate",
        target_se: float | None = None,
    ) -> list[dict[str, Any]]:
        """One leaderboard row per (reference, model), models judged against themselves left out. Rows
        are grouped by reference (the reference with the most models first), best first within each
        group by `sort_by` (a key of SORT_BY; rows without that figure last). target_se (points, with
        humans): add ppi_labels_for_target_se, the labels PPI needs for that standard error."""
        score = SORT_BY[sort_by]
        rng = np.random.default_rng(seed)
        controlled = self._length_controlled() if self.length_control else {}
        slots = {key: slot for slot, key in enumerate(self.tallies)}
        human = self.pairs.figures(confidence, list(self._slots)) if self.pairs is not None else {}
        if self.pairs is not None and target_se is not None:
            for slot, values in slot_values(self.pairs).items():
                human[slot]["ppi_labels_for_target_se"] = labels_for_se(*values, target_se / 100)
        ppi_controlled = (
            self._ppi_length_controlled(human, confidence)
            if self.pairs is not None and self.length_control
            else {}
        )
        rows = []
        for (reference, model), tally in sorted(self.tallies.items()):
            if reference == model:
                continue
            row = leaderboard_row(model, reference, tally, self.annotator(reference, model))
            if self.length_control:
                row.update(controlled.get((reference, model), NO_LENGTH_CONTROL))
                rate = row["length_controlled_win_rate"]
                row["lc_extreme_change"] = (
                    None if rate is None else is_extreme_change(row["win_rate"], rate)
                )
            if self.bootstrap:
                row.update(bootstrap_interval(tally, rng, resamples, confidence))
            if self.pairs is not None:
                row.update(human[slots[(reference, model)]])
                if self.length_control:
                    row.update(ppi_controlled.get((reference, model), NO_PPI_LENGTH_CONTROL))
            rows.append(row)
        if self.pairs is not None:
            _rank_sets(rows, confidence)
        sizes = Counter(row["reference"] for row in rows)
        order = {
            reference: i for i, (reference, _) in enumerate(reversed(self.tallies))
        }  # first seen: largest i
        rows.sort(
            key=lambda row: (
                -sizes[row["reference"]],
                -order[row["reference"]],
                math.inf if row.get(score) is None else -row[score],
            )
        )
        return rows

    def _length_controlled(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The GLM's figures for every (reference, model) with verdicts and lengths."""
        if not self._verdicts:
            return {}
        # One array per column (the chunks freed as soon as they are joined), then sorted by slot,
        # stably so that each model's verdicts keep their order: each model's verdicts are one slice
        # (views, not a copy or a mask per model).
        self._verdicts = [
            tuple(np.concatenate(column) for column in zip(*self._verdicts, strict=True))
        ]
        order = np.argsort(self._verdicts[0][0], kind="stable")
        self._verdicts = [tuple(column[order] for column in self._verdicts[0])]
        del order
        slots, items, delta, x, _ = self._verdicts[0]
        if not len(slots):
            return {}
        present, starts = np.unique(slots, return_index=True)
        ends = [*starts[1:].tolist(), len(slots)]
        names = [(reference or "", model) for reference, model in self._slots]
        by_reference: dict[str, list[tuple[int, slice]]] = {}
        for slot, start, end in zip(present.tolist(), starts.tolist(), ends, strict=True):
            reference, model = names[slot]
            if reference != model:
                by_reference.setdefault(reference, []).append((slot, slice(start, end)))
        results = {}
        for reference, members in by_reference.items():
            group = [slot for slot, _ in members]
            verdicts = [(items[part], delta[part], x[part]) for _, part in members]
            fits, difficulty, source, note = board_fits(
                reference, verdicts, self._items, self.difficulty
            )
            figures = [{**fit.figures(), "lc_difficulty": source} for fit in fits]
            self._lc_difficulty[reference] = difficulty
            self._lc_penalty.update(
                {slot: fit.penalty for slot, fit in zip(group, fits, strict=True)}
            )
            self.lc_notes.append(note)
            results.update({names[slot]: row for slot, row in zip(group, figures, strict=True)})
        return results

    def _ppi_length_controlled(
        self, human: dict[int, dict[str, Any]], confidence: float
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """The prediction-powered length-controlled win rate (length_control.ppi_length_controlled)
        of every (reference, model) whose verdicts two labels or more fall on, uniformly drawn (labels
        with a sampling_probability are left out), its lambda the row's ppi_lambda, at the
        instruction difficulties and penalties of the board's own length-controlled win rates (a fit
        that does not converge leaves the row's columns empty); the other models against the same
        reference are left out of that fit. After `_length_controlled`."""
        if not self._verdicts:
            return {}
        slots, items, delta, x, pairs = self._verdicts[0]
        labelled, label, weighted = self.pairs.labels_by_pair()
        present, starts = np.unique(slots, return_index=True)
        ends = [*starts[1:].tolist(), len(slots)]
        names = [(reference or "", model) for reference, model in self._slots]
        groups: dict[str, list[tuple[int, slice]]] = {}
        for slot, start, end in zip(present.tolist(), starts.tolist(), ends, strict=True):
            reference, model = names[slot]
            mine = pairs[start:end]
            lam = human.get(slot, {}).get("ppi_lambda")
            if reference == model or lam is None or weighted[mine].any():
                continue
            if labelled[mine].sum() >= 2:
                groups.setdefault(reference, []).append((slot, slice(start, end)))
        results = {}
        for reference, members in groups.items():
            verdicts = [(items[part], delta[part], x[part]) for _, part in members]
            labels = [
                (labelled[pairs[part]], label[pairs[part]], human[slot]["ppi_lambda"])
                for slot, part in members
            ]
            difficulty = self._lc_difficulty.get(reference)
            if difficulty is None:  # one model and no file: no difficulty term
                difficulty = np.zeros(len(self._items))
            penalties = [self._lc_penalty[slot] for slot, _ in members]
            figures = ppi_length_controlled(
                reference, verdicts, labels, difficulty, penalties, confidence
            )
            results.update(
                {
                    names[slot]: row
                    for (slot, _), row in zip(members, figures, strict=True)
                    if row is not None
                }
            )
        return results

    def comparison(self, model_a: str, model_b: str, confidence: float = 0.95) -> dict[str, Any]:
        """Paired comparison of two models on the items both were judged on (see `paired`); with
        human labels, the prediction-powered difference beside it (PairLedger.difference)."""
        row = paired(model_a, model_b, self.items.get(model_a, {}), self.items.get(model_b, {}))
        if self.pairs is not None:
            references = [
                reference
                for reference, model in self._slots
                if model == model_a and (reference, model_b) in self._slots
            ]
            if len(references) != 1:
                raise FarmError(
                    f"--compare {model_a} {model_b} --humans: the two models are judged against "
                    f"{len(references) or 'no'} common references; expected one (choose it with "
                    "--reference-generator)"
                )
            row.update(
                self.pairs.difference(
                    self._slots[(references[0], model_a)],
                    self._slots[(references[0], model_b)],
                    confidence,
                )
            )
        return row


def _rank_sets(rows: list[dict[str, Any]], confidence: float) -> None:
    """ppi_rank_low and ppi_rank_high of each row with a prediction-powered win rate: its rank sets
    among the rows against the same reference that have one (farmkit/evaluate/ppi.py rank_sets),
    holding together at `confidence`."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        row["ppi_rank_low"] = row["ppi_rank_high"] = None
        if row.get("ppi_win_rate") is not None:
            groups.setdefault(row["reference"], []).append(row)
    for group in groups.values():
        estimates = np.array([row["ppi_win_rate"] for row in group])
        errors = np.array([row["ppi_standard_error"] for row in group])
        best, worst, _, _ = rank_sets(estimates, errors, confidence)
        for row, low, high in zip(group, best.tolist(), worst.tolist(), strict=True):
            row["ppi_rank_low"], row["ppi_rank_high"] = low, high


def _checked_chunks(path: str, name: str) -> Iterator[tuple[list[int], list[dict[str, Any]]]]:
    """(line numbers, preference records) a chunk at a time; a record the schema refuses is raised
    (--on-error fail) or left out and counted."""
    policy, kept = bad_records(), 0
    for numbers, records in iter_json_chunks(path, CHUNK):
        bad = first_invalid(records, "preference")
        if bad is not None:  # raised at the first (--on-error fail), else each left out
            good = []
            for index in range(bad, len(records)):
                problem = problems(records[index], "preference")
                if problem:
                    policy.reject(RecordError(name, numbers[index], problem))
                else:
                    good.append(index)
            good = list(range(bad)) + good
            numbers, records = [numbers[i] for i in good], [records[i] for i in good]
        kept += len(records)
        yield numbers, records
    policy.finish(name, kept)


def _histogram(
    tallies: list[Tally], name: str, cells: np.ndarray, width: int, sums: list[np.ndarray]
) -> None:
    """Add counts and sums per cell (slot * width + bin) to each tally's dense histogram `name`."""
    size = len(tallies) * width
    columns = [np.bincount(cells, minlength=size)] + [
        np.bincount(cells, weights=v, minlength=size) for v in sums
    ]
    table = np.stack(columns, axis=-1).astype(np.float64).reshape(len(tallies), width, len(columns))
    for index in np.flatnonzero(table[:, :, 0].sum(axis=1)):
        tally = tallies[index]
        current = getattr(tally, name)
        setattr(tally, name, table[index] if current is None else current + table[index])


def leaderboard_row(
    model: str, reference: str, tally: Tally, annotator: str | None = None
) -> dict[str, Any]:
    n = tally.n
    mean = tally.total / n if n else None
    if n > 1:
        variance = max(tally.total_sq - n * mean * mean, 0.0) / (n - 1)
        standard_error = 100 * math.sqrt(variance / n)
    else:
        standard_error = None
    return {
        "generator": model,
        "reference": reference,
        "annotator": annotator,
        "win_rate": 100 * mean if n else None,
        "standard_error": standard_error,
        "n_wins": tally.wins,
        "n_losses": tally.losses,
        "n_draws": tally.draws,
        "n_total": n,
        "n_dropped": tally.dropped,
        "discrete_win_rate": 100 * (tally.wins + tally.draws / 2) / n if n else None,
        "avg_length": tally.length_sum // tally.length_n if tally.length_n else None,
    }


def bootstrap_interval(
    tally: Tally, rng: np.random.Generator, resamples: int, confidence: float
) -> dict[str, Any]:
    """Percentile bootstrap of the win rate over items, drawn from the histogram of verdicts (exact
    for 1 / 1.5 / 2 verdicts; fractional ones are grouped on a 1e-4 grid at their group's mean)."""
    if tally.n == 0:
        return {"ci_low": None, "ci_high": None}
    cells = tally.values[tally.values[:, 0] > 0]
    counts, means = cells[:, 0], cells[:, 1] / cells[:, 0]
    estimates = []
    for start in range(0, resamples, 200):
        draws = rng.multinomial(tally.n, counts / tally.n, size=min(200, resamples - start))
        estimates.append(draws @ means / tally.n)
    low, high = np.quantile(np.concatenate(estimates), [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"ci_low": 100 * float(low), "ci_high": 100 * float(high)}


def paired(model_a: str, model_b: str, items_a: dict, items_b: dict) -> dict[str, Any]:
    """Difference of win rates (a - b) on the items both models have (a model's several verdicts
    on one item are averaged first), with the paired standard error and a two-sided t-test p-value."""
    from scipy import stats

    common = sorted(set(items_a) & set(items_b), key=repr)
    a = np.array([items_a[key][1] / items_a[key][0] for key in common])
    b = np.array([items_b[key][1] / items_b[key][0] for key in common])
    result: dict[str, Any] = {
        "model_a": model_a,
        "model_b": model_b,
        "n_items": len(common),
        "win_rate_a": 100 * float(a.mean()) if len(common) else None,
        "win_rate_b": 100 * float(b.mean()) if len(common) else None,
        "difference": None,
        "standard_error": None,
        "p_value": None,
    }
    if len(common) < 2:
        return result
    differences = a - b
    standard_error = float(differences.std(ddof=1) / math.sqrt(len(common)))
    result["difference"] = 100 * float(differences.mean())
    result["standard_error"] = 100 * standard_error
    if standard_error > 0:
        t = float(differences.mean()) / standard_error
        result["p_value"] = float(2 * stats.t.sf(abs(t), df=len(common) - 1))
    else:
        result["p_value"] = 1.0 if differences.mean() == 0 else 0.0
    return result


# --sort-by: the figure a board is ordered by
SORT_BY = {"win_rate": "win_rate", "lc": "length_controlled_win_rate"}

# Columns shown by the human-readable formats (jsonl and csv carry every field).
TABLE_COLUMNS = (
    "generator",
    "reference",
    "win_rate",
    "standard_error",
    "ci_low",
    "ci_high",
    "length_controlled_win_rate",
    "n_wins",
    "n_losses",
    "n_draws",
    "n_total",
    "n_dropped",
    "avg_length",
    # with --humans (farmkit/evaluate/ppi.py)
    "n_human",
    "human_win_rate",
    "ppi_win_rate",
    "ppi_standard_error",
    "ppi_ci_low",
    "ppi_ci_high",
    "ppi_lc_win_rate",
    "ppi_lc_ci_low",
    "ppi_lc_ci_high",
    "ppi_labels_for_target_se",
    # with --old-judge: the old judge's verdicts on a subset in place of the humans'
    "n_old_judge",
    "old_judge_win_rate",
    "ppi_rank_low",
    "ppi_rank_high",
    "small_sample",
)


@dataclass
class WinrateConfig:
    """farm-winrate's settings (its options; -o and --seed are the shared ones)."""

    reference: str | None = help_field(
        None,
        "The generator that is the reference (the name in generator_1/generator_2; farm-annotate "
        "--reference FILE puts it in position 1): records are oriented so that it is in position 1 "
        "(records with it in position 2 are swapped); records without it are skipped.",
        flags=("--reference-generator",),
        aliases=("--reference",),
        metavar="NAME",
    )
    swap: bool = help_field(
        False,
        "The model is in position 1 and the reference in position 2 in every record.",
        flag=True,
    )
    fmt: str = help_field(
        "jsonl",
        "jsonl: leaderboard rows (records); table, csv, markdown: for people and spreadsheets; "
        "alpaca-eval: the CSV AlpacaEval publishes its leaderboards in (its column names and order, the "
        "model as the unnamed first column; one reference).",
        tuple(BOARD_FORMATS),
        flags=("--format",),
    )
    sort_by: str = help_field(
        "win_rate",
        "Order each reference's rows by the raw win rate or by the length-controlled one (lc), best first.",
        tuple(SORT_BY),
    )
    bootstrap: int = help_field(
        0,
        "Add a percentile bootstrap confidence interval (ci_low, ci_high) from N resamples of the items.",
        bounds=NON_NEGATIVE,
        metavar="N",
    )
    confidence: float = help_field(
        0.95,
        "Level of the bootstrap interval and of the prediction-powered one (--humans).",
        bounds=Bounds(0, 1, min_open=True, max_open=True),
    )
    compare: tuple[tuple[str, str], ...] = help_field(
        (),
        "Instead of the leaderboard, compare two models on the items both were judged on: "
        "difference of win rates, its paired standard error and p-value. Repeatable.",
        nargs=2,
        multiple=True,
        metavar="MODEL_A MODEL_B",
        show_default=False,
    )
    no_length_control: bool = help_field(
        False,
        "Skip the length-controlled win rate (faster, and memory "
        "that does not grow with the records).",
        flag=True,
    )
    difficulty_file: str | None = help_field(
        None,
        "Instruction difficulties for the length-controlled win rate (AlpacaEval's instruction_difficulty.csv, "
        "or records with instruction_difficulty and an id, instruction_index or instruction). Default: "
        "estimated from the input when it holds two models or more against a reference.",
        flags=("--instruction-difficulty",),
        path={"dir_okay": False},
        metavar="FILE",
    )
    dedupe: bool = help_field(
        False,
        "Count only the first verdict on each instruction per model and "
        "reference (repeats are reported either way).",
        flag=True,
    )
    humans: str | None = help_field(
        None,
        "Human labels (preference records, farm-label's for instance) on a uniformly random subset "
        "of the pairs in PREFS, or drawn with the sampling_probability each records (farm-label "
        "--judge; weighted by its inverse). Each row adds the humans' own win rate on its labelled "
        "pairs (human_win_rate, n_human, Wilson's human_ci_low and human_ci_high) and the "
        "prediction-powered one (PPI++: the simulated verdicts on every pair, their bias corrected by "
        "the human labels): ppi_win_rate, ppi_standard_error, ppi_ci_low and ppi_ci_high at "
        "--confidence (inside [0, 100]), ppi_lambda, the rank set ppi_rank_low..ppi_rank_high, and "
        "small_sample (below 40 labels, also said on stderr); with length control, the "
        "prediction-powered length-controlled win rate ppi_lc_win_rate, ppi_lc_standard_error, "
        "ppi_lc_ci_low and ppi_lc_ci_high (the GLM fitted to the labels, helped by the simulated "
        "verdicts, at the board's instruction difficulties). With --compare, the paired "
        "prediction-powered difference (ppi_difference and its interval). A label finds its pair by "
        "the texts (in either order), else by id and generators; a label on no simulated pair is an "
        "error.",
        path={"dir_okay": False},
        metavar="LABELS",
    )
    old_judge: str | None = help_field(
        None,
        "Carry a board across a judge's retirement: PREFS are the new judge's verdicts, FILE the old "
        "judge's on a uniformly random subset of the same pairs. --humans with the old judge as the "
        "humans: ppi_win_rate and its interval (ppi_ci_low, ppi_ci_high) estimate the old judge's "
        "win rate, and ppi_lc_win_rate with its interval (ppi_lc_ci_low, ppi_lc_ci_high) its "
        "length-controlled win rate at the board's instruction difficulties; its own columns are "
        "n_old_judge, old_judge_win_rate and old_judge_standard_error. Not with --humans.",
        path={"dir_okay": False},
        metavar="FILE",
    )
    include_screened: bool = shared_field("include_screened", False)
    target_se: float | None = help_field(
        None,
        "With --humans or --old-judge (also in --plan): add ppi_labels_for_target_se, the number of labels "
        "(human, or the old judge's) that PPI needs for a standard error of SE points, from the "
        "labels given as a pilot.",
        bounds=Bounds(0, 50, min_open=True),
        metavar="SE",
    )
    baseline: str | None = help_field(
        None,
        "Instead of the leaderboard, every other model against this one with a paired test on the "
        "prompts both were judged on (as --compare), the p-values adjusted across the board "
        "(--adjust: p_adjusted, significant at 1 - --confidence); stderr says the board's "
        "separability (the share of model pairs whose intervals do not overlap).",
        metavar="MODEL",
    )
    adjust: str = help_field(
        "holm",
        "How --baseline adjusts its p-values: holm (family-wise error rate) or bh "
        "(Benjamini-Hochberg, false discovery rate).",
        ("holm", "bh"),
    )
    plan: bool = help_field(
        False,
        "Treat PREFS as a pilot: per model, the prompts needed to detect a difference of --detect "
        "points (against --baseline's model, else against 50%) with a two-sided test at level "
        "1 - --confidence and --power, from the pilot's standard deviation; with --humans and "
        "--target-se, also the human labels PPI needs.",
        flag=True,
    )
    detect: float = help_field(
        5.0,
        "The difference (win-rate points) --plan plans to detect.",
        bounds=Bounds(0, 100, min_open=True),
        metavar="D",
    )
    power: float = help_field(
        0.8,
        "The power --plan plans for.",
        bounds=Bounds(0, 1, min_open=True, max_open=True),
    )
    canaries: str | None = help_field(
        None,
        "Instead of ranking, check the judge for drift: PREFS are tonight's verdicts on the canary "
        "pairs (asked past the cache: farm-annotate --no-cache), FROZEN their first verdicts, each "
        "canary asked twice when frozen (the judge's self-agreement is the baseline). One row: "
        "canary_agreement, canary_baseline, canary_p_value (one-sided exact binomial test), "
        "judge_drift; a drift prints one line and exits 4 after writing it (and --history).",
        path={"dir_okay": False},
        metavar="FROZEN",
    )
    drift_level: float = help_field(
        0.01,
        "The level of --canaries' test: a drift when its p-value is below it.",
        bounds=Bounds(0, 1, min_open=True, max_open=True),
    )
    plot: str | None = help_field(
        None,
        "Also draw the win rates (and the length-controlled ones) "
        "with their intervals as a PNG bar chart.",
        path={"dir_okay": False},
    )
    history: str | None = help_field(
        None,
        "Also append the rows to this JSONL "
        "history, stamped with the time, a run id and each input's SHA-256 (safe from concurrent runs); "
        "`farm-plot history FILE` draws it.",
        path={"dir_okay": False},
        metavar="FILE",
    )
    ledger: str | None = help_field(
        None,
        "Instead of ranking PREFS, total this farm-annotate --ledger file: one row per day (UTC) with its "
        "runs, pairs, requests, tokens and price, batch and direct apart, each judge's as price:MODEL; "
        "`farm-plot curves FILE` draws the rows written with -o.",
        path={"exists": True, "dir_okay": False},
        metavar="FILE",
    )
