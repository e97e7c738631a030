"""Judge prompts: the template files in prompts/ and the worked examples, filled in one pass (the
verdict parser that reads a judge's reply is farmkit/annotate/parse.py).

A template file starts with `format: plain|json|ranking|choice` and has sections:
`[system]`, `[user]` (with `{examples}`, `{count}` and `{pairs}`), `[pair]` (one compared pair:
`{index}`, `{instruction}`, `{input}`, `{output_a}`, `{output_b}`), `[input]` (how a non-empty input
is shown) and, for `choice` templates read by the local backend, `[answer]` (the start of the reply).

Filling is a single regex pass over the template: each placeholder is replaced by its value and the
values are never scanned again, so an answer that contains `{output_b}` or a fake verdict line
cannot change the prompt's structure. Every line of an inserted text (answer, instruction, input)
that a reader could take for the template's structure -- a pair header of any template family
(`### Pair 2`, `== Comparison 2 ==`, `--- Set 2 ---`), an answer frame, `Instruction:`, in any case,
spacing or markdown, with invisible characters or not -- is escaped by a leading backslash, so an
answer cannot open a fake pair; and an answer's copies of the template's delimiters are broken (a
zero-width space) so it cannot close its frame.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from farmkit.core.io import FarmError

FORMATS = ("plain", "json", "ranking", "choice")
SECTIONS = ("system", "user", "pair", "input", "answer")
ZERO_WIDTH_SPACE = "\u200b"
PLACEHOLDER = re.compile(r"\{(examples|count|pairs|index|instruction|input|output_a|output_b)\}")


# Pair headers and answer frames of every shipped template family, as _reader_core sees them: an
# answer that forges another family's header could mislead a judge as well as one of its own.
_GENERIC_STRUCTURE = (
    r"(?:pair|set|comparison|example)(?: no)? ?\d+",
    r"(?:end of )?(?:answer|response|reply|output)(?: to)? ?[ab]",
    r"(?:instruction|task|input|additional input|expected reply|now the real task)",
)


def _reader_core(line: str) -> str:
    """A line as a lenient reader (or a model) sees it: compatibility forms folded, invisible
    characters dropped, case, spacing, punctuation and markdown ignored."""
    line = unicodedata.normalize("NFKC", line)
    line = "".join(char for char in line if unicodedata.category(char) != "Cf")
    return " ".join(re.sub(r"[\W_]+", " ", line).lower().split())


@dataclass(frozen=True)
class Example:
    """One worked example (prompts/examples.yaml): a pair, the better answer (A or B) and why."""

    instruction: str
    input: str
    a: str
    b: str
    better: str
    why: str


@functools.cache
def worked_examples() -> tuple[Example, ...]:
    """The shipped worked examples, in order; those a judge is shown are part of its cache key."""
    from farmkit.core.yamltext import safe_yaml

    text = (
        importlib.resources.files("farmkit.annotate")
        .joinpath("prompts", "examples.yaml")
        .read_text(encoding="utf-8")
    )
    rows = safe_yaml(text)
    examples = []
    for number, row in enumerate(rows, start=1):
        try:
            example = Example(
                **{
                    key: str(row.get(key) or "")
                    for key in ("instruction", "input", "a", "b", "better", "why")
                }
            )
        except (
            AttributeError,
            TypeError,
        ) as error:  # pragma: no cover - the shipped file is tested
            raise FarmError(f"prompts/examples.yaml: example {number}: {error}") from None
        if example.better not in ("A", "B") or not (
            example.instruction and example.a and example.b
        ):
            raise FarmError(
                f"prompts/examples.yaml: example {number}: expected instruction, a, b and better: A or B"
            )
        examples.append(example)
    return tuple(examples)


@dataclass(frozen=True)
class Shown:
    """One pair as a judge sees it: answer A is shown first."""

    instruction: str
    input: str
    output_a: str
    output_b: str


@dataclass(frozen=True)
class Template:
    name: str
    format: str
    sections: dict[str, str]
    text: str  # the whole file, part of every cache key

    def messages(self, pairs: list[Shown], examples: int = 0) -> list[dict[str, str]]:
        """Chat messages asking for verdicts on `pairs` (shown in order), after `examples` worked examples."""
        if self.format == "choice":
            if len(pairs) != 1:
                raise ValueError("a choice template judges one pair at a time")
            user = self._pair_text(self.sections["user"], 1, pairs[0])
        else:
            blocks = "".join(
                self._pair_text(self.sections["pair"], i, p) for i, p in enumerate(pairs, start=1)
            )
            user = fill(
                self.sections["user"],
                {"examples": self._examples(examples), "count": str(len(pairs)), "pairs": blocks},
            )
        system = self.sections.get("system", "").strip()
        messages = [{"role": "system", "content": system}] if system else []
        return messages + [{"role": "user", "content": user.strip() + "\n"}]

    def _pair_text(self, section: str, index: int, pair: Shown) -> str:
        shown_input = (
            fill(self.sections["input"], {"input": self._defused(pair.input)}) if pair.input else ""
        )
        values = {
            "index": str(index),
            "instruction": self._defused(pair.instruction),
            "input": shown_input,
            "output_a": self._defused(pair.output_a),
            "output_b": self._defused(pair.output_b),
        }
        return fill(section, values)

    @functools.cached_property
    def delimiters(self) -> tuple[str, ...]:
        """The texts that frame an answer in this template: the lines around an answer placeholder
        that stands alone on its line (`<answer A>`, triple quotes), or the words beside one that does not
        (`Answer A:`)."""
        section = self.sections["user" if self.format == "choice" else "pair"]
        lines = [line.strip() for line in section.splitlines()]
        found: list[str] = []
        for number, line in enumerate(lines):
            if not re.search(r"\{output_[ab]\}", line):
                continue
            if line in ("{output_a}", "{output_b}"):
                found += [
                    lines[n] for n in (number - 1, number + 1) if 0 <= n < len(lines) and lines[n]
                ]
            else:
                found += [
                    part.strip()
                    for part in re.split(r"\{output_[ab]\}", line)
                    if len(part.strip()) >= 3
                ]
        return tuple(dict.fromkeys(found))

    @functools.cached_property
    def structure(self) -> re.Pattern[str]:
        """The lines a reader could take for this template's structure, as _reader_core sees them:
        each literal line of its sections (`### Pair {index}`, `<answer A>`, `Instruction:`,
        `Response B:`), with `{index}` and `{count}` as any number and other placeholders as any
        text, and the pair headers and answer frames of every shipped template family."""
        shapes = set(_GENERIC_STRUCTURE)
        for name in ("system", "user", "pair", "input", "answer"):
            for line in self.sections.get(name, "").splitlines():
                core = _reader_core(
                    PLACEHOLDER.sub(lambda m: f" qq{m.group(1)}qq ".replace("_", ""), line)
                )
                if not re.sub(r"qq\w+?qq| ", "", core):  # a placeholder alone: any text
                    continue
                pattern = re.escape(core)
                pattern = re.sub(r"qq(?:index|count)qq", lambda _: r"\d+", pattern)
                shapes.add(re.sub(r"qq\w+?qq", lambda _: ".*", pattern))
        return re.compile("|".join(sorted(shapes)))

    def _defused(self, text: str) -> str:
        """`text` with every line that a reader could take for the template's structure (a pair
        header, an answer frame, `Instruction:`, in any case, spacing or markdown) escaped by a
        backslash, and every delimiter of the template broken by a zero-width space after its
        first character, so an answer can neither open a fake pair nor close its frame."""
        lines = text.splitlines(keepends=True)
        for number, line in enumerate(lines):
            body = line.rstrip("\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
            # a header is short: the start of a long line is enough (and keeps this linear)
            if body.strip() and self.structure.fullmatch(_reader_core(body[:300])):
                stripped = line.lstrip()
                lines[number] = line[: len(line) - len(stripped)] + "\\" + stripped
        text = "".join(lines)
        for delimiter in self.delimiters:
            text = text.replace(delimiter, delimiter[0] + ZERO_WIDTH_SPACE + delimiter[1:])
        return text

    def _examples(self, count: int) -> str:
        if count <= 0:
            return ""
        available = worked_examples()
        if count > len(available):
            raise FarmError(
                f"a judge asks for {count} worked examples; prompts/examples.yaml has {len(available)}"
            )
        parts = ["Worked examples of the task and the expected reply:\n"]
        for number, example in enumerate(available[:count], start=1):
            block = self._pair_text(
                self.sections["pair"],
                1,
                Shown(example.instruction, example.input, example.a, example.b),
            )
            verdict = render_verdicts(self.format, [(example.better, example.why)])
            parts.append(f"Example {number}:\n{block}Expected reply:\n{verdict}\n")
        return "\n".join(parts) + "\nNow the real task.\n\n"

    @property
    def answer_prefix(self) -> str:
        return self.sections.get("answer", "").strip()


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every known placeholder in one pass; values are inserted verbatim, never re-scanned."""
    return PLACEHOLDER.sub(lambda match: values.get(match.group(1), match.group(0)), template)


def render_verdicts(format: str, verdicts: list[tuple[str, str]]) -> str:
    """The reply a perfect judge would write, in a template's format (for the worked examples)."""
    if format == "json":
        entries = [
            {"pair": i, "rationale": why, "better": better}
            for i, (better, why) in enumerate(verdicts, start=1)
        ]
        return json.dumps({"verdicts": entries})
    if format == "ranking":
        return "\n".join(
            f"Pair {i}: {b} > {'B' if b == 'A' else 'A'}"
            for i, (b, _) in enumerate(verdicts, start=1)
        )
    return "\n".join(f"Pair {i}: {b}" for i, (b, _) in enumerate(verdicts, start=1))


def parse_template(name: str, text: str) -> Template:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("format:"):
        raise FarmError(
            f"prompt template {name}: the first line must be `format: {'|'.join(FORMATS)}`"
        )
    format = lines[0].split(":", 1)[1].strip()
    if format not in FORMATS:
        raise FarmError(
            f"prompt template {name}: unknown format {format!r}; expected one of {', '.join(FORMATS)}"
        )
    sections: dict[str, list[str]] = {}
    current = None
    for line in lines[1:]:
        header = re.fullmatch(r"\[(\w+)\]", line.strip())
        if header and header.group(1) in SECTIONS:
            current = header.group(1)
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    joined = {key: "\n".join(value) + "\n" for key, value in sections.items()}
    required = ("user", "input") if format == "choice" else ("user", "pair", "input")
    missing = [section for section in required if section not in joined]
    if missing:
        raise FarmError(f"prompt template {name}: missing section(s) {', '.join(missing)}")
    if format != "choice" and "{pairs}" not in joined["user"]:
        raise FarmError(f"prompt template {name}: the [user] section must contain {{pairs}}")
    return Template(name, format, joined, text)


@functools.cache
def load_template(name: str) -> Template:
    """A template file path, or a shipped template by name (prompts/NAME.txt)."""
    path = Path(name)
    if path.suffix == ".txt" and path.is_file():
        return parse_template(path.stem, path.read_text(encoding="utf-8"))
    shipped = importlib.resources.files("farmkit.annotate").joinpath("prompts", f"{name}.txt")
    if "/" in name or not shipped.is_file():
        raise FarmError(
            f"no prompt template {name!r}: not a shipped template ({', '.join(shipped_templates())}) nor a .txt file"
        )
    return parse_template(name, shipped.read_text(encoding="utf-8"))


def shipped_templates() -> list[str]:
    folder = importlib.resources.files("farmkit.annotate").joinpath("prompts")
    return sorted(entry.name[:-4] for entry in folder.iterdir() if entry.name.endswith(".txt"))
