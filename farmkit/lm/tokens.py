"""The expected token count of a text without its tokenizer: what farm-annotate's budget and price
estimates count, and what farm-sample records where an endpoint does not report its counts."""

from __future__ import annotations

import math
import re

# The expected token count of a text, script by script: what byte-level BPE tokenizers (measured on
# the embedded model's, SmolLM2) make of each kind of character. The 5th to 95th percentile of
# estimate / real lies within 0.74-1.06 for Latin script, CJK, Cyrillic, emoji and code texts
# (issue 22's audit, bench/README.md); tokenizers with larger multilingual vocabularies (GPT-4o's) make fewer
# tokens of CJK and Cyrillic.
_WORD = re.compile(r"[A-Za-z]+")  # an English word is about a token; a long one a token per 4 more
_DIGIT = re.compile(r"[0-9]")  # a token each
_SYMBOL = re.compile(r"[!-/:-@\[-`{-~]")  # ASCII punctuation: most a token each, some merge
_RUN = re.compile(r"([!-/:-@\[-`{-~])\1{3,}")  # a rule of dashes or equals signs: a token or so
_SPACES = re.compile(r"[ \t]*\n\s*|[ \t]{2,}")  # line breaks, indentation, alignment
_NEWLINE = re.compile(r"\n")
_TWO_BYTES = re.compile(r"[\u0080-\u07ff]")  # accented Latin, Cyrillic, Greek, Hebrew, Arabic
_HANGUL = re.compile(r"[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]")
_HAN_KANA = re.compile(r"[\u2e80-\u312f\u3190-\u9fff\uf900-\ufaff\uff00-\uffef]")
_MARKS = re.compile(r"[\u2000-\u2bff\ufe00-\ufe0f]")  # typographic quotes, dashes, arrows
_THREE_BYTES = re.compile(r"[\u0800-\uffff]")  # the rest of the 3-byte characters (Indic, Thai...)
_FOUR_BYTES = re.compile(r"[\U00010000-\U0010ffff]")  # emoji and rare scripts
RATES = {
    "word": 1.0,
    "letters_per_extra_token": 4.0,  # beyond 6 letters a word
    "digit": 1.0,
    "symbol": 0.8,
    "run_chars_per_token": 16.0,
    "break": 0.75,
    "newline": 0.25,
    "two_bytes": 0.8,
    "hangul": 2.7,
    "han_kana": 1.9,
    "marks": 1.0,
    "three_bytes": 2.0,
    "four_bytes": 2.9,
}


def estimate_tokens(text: str) -> int:
    """The expected token count of `text`, each script at its own rate (see RATES): characters / 4
    read Chinese at half its tokens and code at 0.4 to 0.6 (estimates only: records carry the
    endpoint's counts, the budget its bound)."""
    rates = RATES
    words = _WORD.findall(text)
    letters = sum(map(len, words))
    symbols = float(len(_SYMBOL.findall(text)))
    for run in _RUN.finditer(text):
        size = run.end() - run.start()
        symbols -= size - size / rates["run_chars_per_token"] / rates["symbol"]
    hangul, han_kana = len(_HANGUL.findall(text)), len(_HAN_KANA.findall(text))
    marks = len(_MARKS.findall(text))
    tokens = (
        rates["word"] * len(words)
        + max(0.0, letters - 6 * len(words)) / rates["letters_per_extra_token"]
        + rates["digit"] * len(_DIGIT.findall(text))
        + rates["symbol"] * symbols
        + rates["break"] * len(_SPACES.findall(text))
        + rates["newline"] * len(_NEWLINE.findall(text))
        + rates["two_bytes"] * len(_TWO_BYTES.findall(text))
        + rates["hangul"] * hangul
        + rates["han_kana"] * han_kana
        + rates["marks"] * marks
        + rates["three_bytes"] * (len(_THREE_BYTES.findall(text)) - hangul - han_kana - marks)
        + rates["four_bytes"] * len(_FOUR_BYTES.findall(text))
    )
    return math.ceil(tokens)
