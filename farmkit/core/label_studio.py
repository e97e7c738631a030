"""Label Studio's JSON, for teams that label there: pairs as the tasks it imports, and its export
as preference records in farm-label's fields (farm-convert --to label-studio, and reading an export).

Task data keys are the pair's own fields, plus `left` and `right`, the two outputs in the order
shown, and `farmkit_left`, the field shown on the left (output_1 or output_2): the side is a seeded
coin per pair, since people favour a side as judges do. The labeling config (LABEL_STUDIO_CONFIG)
asks which side is better with a Pairwise control, exported as {"selected": "left" | "right"}, and by
how much with a Choices control named `strength` ("much better", "slightly better", or "about the
same": a tie, whichever side was selected). Each annotation that was not cancelled becomes one
record: annotator (`completed_by`: a user id, or a user's email), preference 1, 2 or 1.5, strength
(much, slightly or null), shown ([left, right]), seconds (`lead_time`) and time (`created_at`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from farmkit.core.formats import FormatError
from farmkit.core.io import RecordError, dumps
from farmkit.core.seeds import unit_interval

log = logging.getLogger("farmkit")

# the labeling config the tasks are made for (the project's Labeling Interface, Code)
LABEL_STUDIO_CONFIG = """<View>
  <Header value="Which response follows the instruction better?"/>
  <Text name="instruction" value="$instruction"/>
  <Text name="input" value="$input"/>
  <Pairwise name="preference" toName="left,right"/>
  <View style="display: grid; grid-template-columns: 1fr 1fr; column-gap: 1em">
    <Text name="left" value="$left"/>
    <Text name="right" value="$right"/>
  </View>
  <Header value="By how much?"/>
  <Choices name="strength" toName="left" choice="single" showInline="true">
    <Choice value="much better"/>
    <Choice value="slightly better"/>
    <Choice value="about the same"/>
  </Choices>
</View>
"""
LABEL_STUDIO_STRENGTHS = {"much better": "much", "slightly better": "slightly"}
LABEL_STUDIO_TIE = "about the same"
LEFT_FIELD = "farmkit_left"  # which output a task shows on the left: output_1 or output_2
_TASK_ONLY = ("left", "right", LEFT_FIELD)  # task data that is not the pair's


def is_label_studio_export(record: Any) -> bool:
    """Whether a record is a task of Label Studio's JSON export (its data and its annotations)."""
    return (
        isinstance(record, dict)
        and isinstance(record.get("data"), dict)
        and "annotations" in record
    )


def label_studio_tasks(pairs: Iterable[dict[str, Any]], seed: int = 0) -> str:
    """Pairs as the JSON array of tasks Label Studio imports, each pair's outputs on the sides a
    seeded coin gives it (by its texts, not its place: people favour a side as judges do)."""
    tasks = []
    for pair in pairs:
        texts = (pair["instruction"], pair.get("input") or "", pair["output_1"], pair["output_2"])
        swapped = unit_interval(seed, "label-studio left", *texts) < 0.5
        tasks.append(dumps(label_studio_task(pair, swapped)).decode().rstrip())
    return "[" + ",\n".join(tasks) + "]\n"


def label_studio_task(pair: dict[str, Any], swapped: bool) -> dict[str, Any]:
    """A pair as a Label Studio task for LABEL_STUDIO_CONFIG, output_2 shown on the left when
    `swapped`."""
    shown = ("output_2", "output_1") if swapped else ("output_1", "output_2")
    data = {key: value for key, value in pair.items() if key not in _TASK_ONLY}
    data.setdefault("input", "")
    data.update(left=pair[shown[0]], right=pair[shown[1]], **{LEFT_FIELD: shown[0]})
    return {"data": data}


def _annotator(annotation: dict[str, Any]) -> str:
    """Who completed an annotation: Label Studio exports a user id, or a user object."""
    who = annotation.get("completed_by")
    if isinstance(who, dict):
        who = who.get("email") or who.get("username") or who.get("id")
    if isinstance(who, bool) or not isinstance(who, (int, str)) or who == "":
        raise FormatError(
            f"annotation {annotation.get('id')!r} names no annotator; expected `completed_by` "
            "(a user id or a user with an email)"
        )
    return str(who)


def _verdict(result: Any, left: str) -> tuple[float, str | None] | None:
    """(preference, strength) of an annotation's result (None: it chose nothing)."""
    if not isinstance(result, list):
        raise FormatError("an annotation's `result` is not a list; expected Label Studio's results")
    selected = strength = None
    for item in result:
        value = item.get("value") if isinstance(item, dict) else None
        if not isinstance(value, dict):
            raise FormatError(f"a result {item!r} has no `value` object; expected Label Studio's")
        if item.get("type") == "pairwise":
            selected = value.get("selected")
            if selected not in ("left", "right"):
                raise FormatError(
                    f"a pairwise result selects {selected!r}; expected 'left' or 'right'"
                )
        elif item.get("type") == "choices" and item.get("from_name") == "strength":
            choices = value.get("choices") or [None]
            strength = choices[0]
            if strength != LABEL_STUDIO_TIE and strength not in LABEL_STUDIO_STRENGTHS:
                known = ", ".join(map(repr, [*LABEL_STUDIO_STRENGTHS, LABEL_STUDIO_TIE]))
                raise FormatError(f"strength {strength!r} is not one of {known}")
    if strength == LABEL_STUDIO_TIE:
        return 1.5, None
    if selected is None:
        return None
    side = left if selected == "left" else ("output_2" if left == "output_1" else "output_1")
    return (1.0 if side == "output_1" else 2.0), LABEL_STUDIO_STRENGTHS.get(strength)


def label_studio_preferences(task: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The preference records of one exported task, one per annotation that was not cancelled, in
    farm-label's fields (annotator, preference, strength, shown, seconds, time); and how many
    annotations chose nothing (left out)."""
    data = task["data"]
    left = data.get(LEFT_FIELD, "output_1")
    if left not in ("output_1", "output_2"):
        raise FormatError(f"{LEFT_FIELD} is {left!r}; expected 'output_1' or 'output_2'")
    for name in ("instruction", "output_1", "output_2"):
        if not isinstance(data.get(name), str):
            raise FormatError(f"the task's data has no text {name!r}; expected a pair's fields")
    if not isinstance(task["annotations"], list):
        raise FormatError("`annotations` is not a list; expected Label Studio's export")
    pair = {key: value for key, value in data.items() if key not in _TASK_ONLY}
    records, empty = [], 0
    for annotation in task["annotations"]:
        if not isinstance(annotation, dict):
            raise FormatError("an annotation is not an object; expected Label Studio's export")
        if annotation.get("was_cancelled"):
            continue
        verdict = _verdict(annotation.get("result"), left)
        if verdict is None:
            empty += 1
            continue
        preference, strength = verdict
        records.append(
            {
                **pair,
                "preference": preference,
                "strength": strength,
                "annotator": _annotator(annotation),
                "shown": [left, "output_2" if left == "output_1" else "output_1"],
                "seconds": annotation.get("lead_time"),
                "time": annotation.get("created_at"),
            }
        )
    return records, empty


def label_studio_records(tasks: Iterable[tuple[int, Any]], source: str) -> list[dict[str, Any]]:
    """The preference records of the (number, task) items of Label Studio's export read from
    `source`; a task that is not one raises RecordError naming `source` and its number."""
    rows, empty = [], 0
    for number, task in tasks:
        if not is_label_studio_export(task):
            raise RecordError(
                source,
                number,
                "not a Label Studio task; expected `data` and `annotations` like the first",
            )
        try:
            found, unanswered = label_studio_preferences(task)
        except FormatError as exc:
            raise RecordError(source, number, f"task {task.get('id')!r}: {exc}") from None
        rows += found
        empty += unanswered
    if empty:
        log.info("farm-convert: left out %d Label Studio annotation(s) that chose nothing", empty)
    log.info("farm-convert: %d Label Studio annotation(s) -> preference records", len(rows))
    return rows
