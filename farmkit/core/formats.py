"""Other projects' record formats, read as farmkit records and written back.

A file's format is detected from its first record and every later record must agree. Read:
- TRL preference data: `prompt`/`chosen`/`rejected` (explicit prompt) or `chosen`/`rejected` whose
  shared beginning is the prompt (implicit), as plain text or as lists of chat messages;
- hh-rlhf dialogue pairs: `chosen`/`rejected` transcripts in "\\n\\nHuman: ... \\n\\nAssistant: ..."
  form, split at the last assistant turn, the earlier turns kept as the conversation;
- TRL prompt-only, prompt-completion and `messages` (conversational language modelling) data, as
  instructions or as outputs;
- AlpacaFarm's published outputs, which carry no `generator`: the file's name stands in.

Written out as TRL rows (farm-convert), a record keeps its other fields (`generator`, `id`,
`sample_index`, ...) in columns of their own, which TRL ignores, and its `input` beside the prompt
that joins it to the instruction; a preference keeps where its chosen output stood
(`farmkit_chosen`), so that reading the rows back gives the records again, in their own order.

A multi-turn prompt is kept in `messages` (the conversation before the response, a list of
{"role", "content"}); `instruction` is then its last user turn, so judges, win rates and every tool
that keys on `instruction` keep working. Models with a chat template render the whole conversation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farmkit.core.fields import help_field

log = logging.getLogger("farmkit")

ROLES = ("system", "user", "assistant")
HUMAN, ASSISTANT = "\n\nHuman:", "\n\nAssistant:"
# the field a soft label keeps when preferences go out as TRL rows: TRL ignores columns it does not know
SOFT_LABEL_FIELD = "farmkit_preference"
# where the chosen output stood in the farmkit record (1 or 2), so that the rows read back as that record
CHOSEN_FIELD = "farmkit_chosen"
# TRL's own columns: a farmkit field of one of these names is not carried beside them
TRL_COLUMNS = ("prompt", "completion", "chosen", "rejected", "messages", "label")


CONVERT_KINDS = ("auto", "preference", "instruction", "output")


@dataclass
class ConvertConfig:
    """farm-convert's settings: the format written and the kind of the records read."""

    target: str = help_field(
        "farmkit",
        "farmkit: any format farmkit reads (TRL, hh-rlhf, chat messages, Parquet) as farmkit records; "
        "trl: TRL rows with plain-text prompts; trl-chat: TRL rows with chat-message prompts; "
        "label-studio: pairs as Label Studio tasks to import (a JSON array; each pair's outputs "
        "left and right in a seeded random order). Label Studio's JSON export reads back as "
        "preference records with --to farmkit.",
        ("farmkit", "trl", "trl-chat", "label-studio"),
        flags=("--to",),
    )
    label_config: str | None = help_field(
        None,
        "With --to label-studio: also write the labeling config (XML) the tasks are made for to FILE "
        "(paste it in the project's Labeling Interface, Code).",
        path={"dir_okay": False},
        metavar="FILE",
        show_default=False,
    )
    kind: str = help_field(
        "auto",
        "What the records are: auto guesses from the first record (pairs with chosen/rejected or "
        "output_1/output_2 are preferences, records with a generator and an output, completion or "
        "messages are outputs, the rest instructions).",
        CONVERT_KINDS,
    )


class FormatError(ValueError):
    """A record that does not fit the format its file was detected as; the message says what was expected."""


Message = dict[str, str]


def check_messages(value: Any, what: str) -> list[Message]:
    """`value` as a list of chat messages, or FormatError naming what is wrong."""
    if not isinstance(value, list) or not value:
        raise FormatError(
            f'{what} is not a list of messages; expected [{{"role": ..., "content": ...}}, ...]'
        )
    for index, message in enumerate(value):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise FormatError(
                f"{what}[{index}] is not a chat message; expected a role in {', '.join(ROLES)} "
                "and a string content"
            )
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _prompt_fields(messages: list[Message]) -> dict[str, Any]:
    """instruction (+ messages when the prompt is more than one user turn) for a conversation that
    ends with the user's turn."""
    if messages[-1]["role"] != "user":
        raise FormatError(
            "the prompt's last message is not the user's; expected the conversation before a reply"
        )
    fields: dict[str, Any] = {"instruction": messages[-1]["content"], "input": ""}
    if len(messages) > 1:
        fields["messages"] = messages
    return fields


def _split_input(text: str, input: Any) -> dict[str, Any]:
    """instruction and input of a one-turn prompt: a row that carries `input` beside a prompt ending
    with it (as farm-convert writes them: the instruction, a blank line, the input) splits there."""
    if isinstance(input, str) and input and text.endswith("\n\n" + input):
        return {"instruction": text[: -len(input) - 2], "input": input}
    return {"instruction": text, "input": ""}


def _prompt_from(value: Any, what: str, input: Any = None) -> dict[str, Any]:
    if isinstance(value, str):
        return _split_input(value, input)
    fields = _prompt_fields(check_messages(value, what))
    if "messages" not in fields:
        fields.update(_split_input(fields["instruction"], input))
    return fields


def _reply(value: Any, what: str) -> str:
    """The text of a reply given as a string or as a list ending with one assistant message."""
    if isinstance(value, str):
        return value
    messages = check_messages(value, what)
    if messages[-1]["role"] != "assistant":
        raise FormatError(f"{what} does not end with the assistant's reply")
    return messages[-1]["content"]


def split_transcript(text: str, what: str) -> tuple[list[Message], str]:
    """An hh-rlhf transcript as (the conversation before the last assistant turn, that turn's text)."""
    cut = text.rfind(ASSISTANT)
    if cut < 0:
        raise FormatError(f"{what} has no '\\n\\nAssistant:' turn; expected an hh-rlhf transcript")
    context, reply = text[:cut], text[cut + len(ASSISTANT) :].strip()
    messages: list[Message] = []
    position = 0
    while position < len(context):
        human, assistant = context.find(HUMAN, position), context.find(ASSISTANT, position)
        starts = [
            (at, marker) for at, marker in ((human, HUMAN), (assistant, ASSISTANT)) if at >= 0
        ]
        if not starts:
            if context[position:].strip():
                raise FormatError(f"{what} has text outside the Human/Assistant turns")
            break
        at, marker = min(starts)
        if context[position:at].strip():
            raise FormatError(f"{what} has text outside the Human/Assistant turns")
        following = [
            x
            for x in (
                context.find(HUMAN, at + len(marker)),
                context.find(ASSISTANT, at + len(marker)),
            )
            if x >= 0
        ]
        end = min(following) if following else len(context)
        role = "user" if marker == HUMAN else "assistant"
        messages.append({"role": role, "content": context[at + len(marker) : end].strip()})
        position = end
    if not messages:
        raise FormatError(f"{what} has no human turn before the assistant's reply")
    return messages, reply


def _common_prefix(first: Any, second: Any) -> int:
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


# -- one converter per format: (record) -> farmkit record -------------------------------------


def _trl_preference(record: dict[str, Any]) -> dict[str, Any]:
    for field in ("chosen", "rejected"):
        if field not in record:
            raise FormatError(f"missing field {field!r}")
    rest = {k: v for k, v in record.items() if k not in ("prompt", "chosen", "rejected")}
    if "prompt" in record:
        fields = _prompt_from(record["prompt"], "prompt", record.get("input"))
        chosen, rejected = (
            _reply(record["chosen"], "chosen"),
            _reply(record["rejected"], "rejected"),
        )
    elif isinstance(record.get("chosen"), list):
        chosen_turns, rejected_turns = (
            check_messages(record["chosen"], "chosen"),
            check_messages(record["rejected"], "rejected"),
        )
        shared = _common_prefix(chosen_turns, rejected_turns)
        if shared == 0 or shared == len(chosen_turns) or shared == len(rejected_turns):
            raise FormatError(
                "chosen and rejected share no prompt; expected the same conversation before two replies"
            )
        fields = _prompt_fields(chosen_turns[:shared])
        chosen, rejected = (
            _reply(chosen_turns[shared:], "chosen"),
            _reply(rejected_turns[shared:], "rejected"),
        )
    else:
        chosen_text, rejected_text = record.get("chosen"), record.get("rejected")
        if not isinstance(chosen_text, str) or not isinstance(rejected_text, str):
            raise FormatError("chosen and rejected are not both strings or both message lists")
        if ASSISTANT in chosen_text and ASSISTANT in rejected_text:
            context, chosen = split_transcript(chosen_text, "chosen")
            other_context, rejected = split_transcript(rejected_text, "rejected")
            if context != other_context:
                raise FormatError(
                    "chosen and rejected continue different conversations; expected the same turns "
                    "before the last '\\n\\nAssistant:'"
                )
            fields = _prompt_fields(context)
        else:
            shared = _common_prefix(chosen_text, rejected_text)
            if shared == 0:
                raise FormatError("chosen and rejected share no prompt; give an explicit `prompt`")
            fields = {"instruction": chosen_text[:shared], "input": ""}
            chosen, rejected = chosen_text[shared:], rejected_text[shared:]
    soft = rest.pop(SOFT_LABEL_FIELD, None)
    position = rest.pop(CHOSEN_FIELD, None)
    # chosen goes first: preference 1 (output_1 better), or the soft label farmkit wrote out for that order
    preference = 1.0 if soft is None else float(soft)
    if position is None or position == 1:
        return {
            **rest,
            **fields,
            "output_1": chosen,
            "output_2": rejected,
            "preference": preference,
        }
    if position != 2:
        raise FormatError(f"{CHOSEN_FIELD} is {position!r}; expected 1 or 2 (where chosen stood)")
    # farm-convert wrote a record whose second output was chosen: put it (and its fields) back there
    return {
        **_swapped(rest),
        **fields,
        "output_1": rejected,
        "output_2": chosen,
        "preference": 3.0 - preference,
    }


def _trl_prompt(record: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in record.items() if k not in ("prompt", "completion")}
    fields = _prompt_from(record["prompt"], "prompt", record.get("input"))
    if "completion" in record:
        fields["output"] = _reply(record["completion"], "completion")
    return {**rest, **fields}


def _trl_messages(record: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in record.items() if k != "messages"}
    messages = check_messages(record["messages"], "messages")
    if messages[-1]["role"] == "assistant":
        return {**rest, **_prompt_fields(messages[:-1]), "output": messages[-1]["content"]}
    return {**rest, **_prompt_fields(messages)}


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    convert: Callable[[dict[str, Any]], dict[str, Any]]


TRL_PREFERENCE = Format(
    "trl-preference", "TRL preference rows (prompt/chosen/rejected)", _trl_preference
)
HH_RLHF = Format(
    "hh-rlhf", "hh-rlhf dialogue pairs (split at the last assistant turn)", _trl_preference
)
TRL_PROMPT = Format("trl-prompt", "TRL prompt / prompt-completion rows", _trl_prompt)
TRL_MESSAGES = Format("trl-messages", "chat `messages` rows", _trl_messages)


def detect(record: Any, kind: str) -> Format | None:
    """The foreign format of a file whose first record is `record`, read as `kind`; None when the
    record is already farmkit's (or when nothing fits, so the schema check names what is missing)."""
    if not isinstance(record, dict):
        return None
    if (
        kind == "preference"
        and "output_1" not in record
        and "chosen" in record
        and "rejected" in record
    ):
        chosen = record["chosen"]
        if "prompt" not in record and isinstance(chosen, str) and ASSISTANT in chosen:
            return HH_RLHF
        return TRL_PREFERENCE
    if kind in ("instruction", "output") and "instruction" not in record:
        if "prompt" in record:
            return TRL_PROMPT
        if "messages" in record:
            return TRL_MESSAGES
    return None


def generator_stand_in(source: str) -> str:
    """The generator of an output file that names none (AlpacaFarm's published outputs): the file's
    name without its folder and extensions (`rlhf_ppo.jsonl.gz` -> `rlhf_ppo`)."""
    return Path(source).name.split(".")[0]


def log_stand_in(source: str) -> None:
    log.info(
        "farmkit: reading %s as AlpacaFarm/AlpacaEval outputs without a generator "
        "(the file's name %r stands in)",
        source,
        generator_stand_in(source),
    )


def converted(
    records: Iterator[tuple[int, Any]],
    kind: str,
    source: str,
    reject: Callable[[str, int, str], None],
) -> Iterator[tuple[int, Any]]:
    """(line, record) pairs with foreign formats converted to `kind`; a record that does not fit the
    format the first one set goes to reject(source, line, message), which raises, or returns to
    have it left out."""
    chosen: Format | None = None
    first = True
    # AlpacaFarm's published outputs (and TRL rows) name no generator: the file's name stands in
    stand_in = generator_stand_in(source)
    for number, record in records:
        if first:
            first = False
            chosen = detect(record, kind)
            if chosen is not None:
                log.info("farmkit: reading %s as %s", source, chosen.description)
            elif (
                kind == "output"
                and isinstance(record, dict)
                and "generator" not in record
                and "output" in record
            ):
                log_stand_in(source)
        if chosen is not None:
            if not isinstance(record, dict):
                reject(
                    source,
                    number,
                    f"a {type(record).__name__} is not a record; expected {chosen.description}",
                )
                continue
            try:
                record = chosen.convert(record)
            except (FormatError, KeyError, TypeError, ValueError) as exc:
                detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                reject(
                    source,
                    number,
                    f"{detail} (the file's first record made it {chosen.description})",
                )
                continue
        if (
            kind == "output"
            and isinstance(record, dict)
            and "generator" not in record
            and "output" in record
        ):
            record = {**record, "generator": stand_in}
        yield number, record


# -- writing TRL's formats ----------------------------------------------------------------------


def chat_content(instruction: str, input: str | None = "") -> str:
    """The user turn of the chat template; API backends send this same text as the user message."""
    return instruction if not input else f"{instruction}\n\n{input}"


def prompt_messages(record: dict[str, Any]) -> list[Message]:
    """The conversation before the reply: `messages` when present, else one user turn."""
    if record.get("messages"):
        return check_messages(record["messages"], "messages")
    return [
        {"role": "user", "content": chat_content(record["instruction"], record.get("input") or "")}
    ]


def _carried(record: dict[str, Any], own: tuple[str, ...]) -> dict[str, Any]:
    """The fields of a record that TRL's row does not hold itself, to go beside it: every field but
    the ones the row is made of (`own`) and TRL's column names. A one-turn prompt's `input` stays, so
    that the prompt (instruction, blank line, input) can be split again when read back."""
    carried = {
        key: value
        for key, value in record.items()
        if key not in own and key not in TRL_COLUMNS and key not in ("instruction", "input")
    }
    if record.get("input") and not record.get("messages"):
        carried["input"] = record["input"]
    return carried


def _swapped(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields with their _1 and _2 names exchanged (generator_1 <-> generator_2, ...)."""
    swap = {"1": "2", "2": "1"}
    return {
        (key[:-1] + swap[key[-1]] if key[-2:] in ("_1", "_2") else key): value
        for key, value in fields.items()
    }


def to_trl(record: dict[str, Any], kind: str, conversational: bool) -> dict[str, Any] | None:
    """A farmkit record as a TRL row: preferences as prompt/chosen/rejected (None for a tie or a null
    verdict, which TRL cannot hold), instructions and outputs as prompt(/completion). The record's
    other fields go along in columns TRL ignores (see _carried); a preference whose second output was
    chosen has its _1/_2 fields exchanged with the outputs, so chosen-first still holds for them, and
    `farmkit_chosen` (2) says so, so that reading the row back restores the record's own order."""
    messages = prompt_messages(record)
    prompt: Any = messages if conversational else messages[-1]["content"]
    if not conversational and len(messages) > 1:
        raise FormatError("a multi-turn prompt cannot be written as plain text; use --to trl-chat")
    if kind == "preference":
        preference = record.get("preference")
        if preference is None or preference == 1.5 or preference == 0:
            return None
        carried = _carried(
            record,
            ("output_1", "output_2", "preference", "messages", SOFT_LABEL_FIELD, CHOSEN_FIELD),
        )
        chosen, rejected = (
            (record["output_1"], record["output_2"])
            if preference < 1.5
            else (record["output_2"], record["output_1"])
        )
        if preference > 1.5:
            carried = _swapped(carried)
        row: dict[str, Any] = {"prompt": prompt}
        if conversational:
            row.update(
                chosen=[{"role": "assistant", "content": chosen}],
                rejected=[{"role": "assistant", "content": rejected}],
            )
        else:
            row.update(chosen=chosen, rejected=rejected)
        if preference not in (1, 2):
            # soft label, expressed for chosen-first order: in [1, 1.5)
            row[SOFT_LABEL_FIELD] = preference if preference < 1.5 else 3.0 - preference
        row[CHOSEN_FIELD] = 1 if preference < 1.5 else 2
        return {**row, **carried}
    row = {"prompt": prompt}
    if isinstance(record.get("output"), str):
        row["completion"] = (
            [{"role": "assistant", "content": record["output"]}]
            if conversational
            else record["output"]
        )
    return {**row, **_carried(record, ("output", "messages"))}
