"""The secrets an endpoint client holds (the API key, the password of the base URL's credentials,
the secret values of its query: api-key, key, token, sig, ...) and the text cleared of them
(`Secrets.redact`), whatever form they come back in: as given, URL-encoded, or base64 (an
`Authorization: Basic` header a gateway echoes, or a secret inside a longer base64 text), whole or
in runs of FRAGMENT or more characters (an endpoint may quote part of a rejected key). Redaction
goes by value, not by where a secret was found: a header, a URL, an error message or a reply."""

from __future__ import annotations

import base64
import functools
import re
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

FRAGMENT = 8  # a run of this many characters of a secret (in any of its forms) is taken for it
SHORTEST = 4  # a shorter secret is not looked for: blanking every "ab" would garble every message
MASK = "***"
# query parameters whose values are secrets (Azure's api-key, SAS's sig, tokens, codes, ...)
_SECRET_PARAMETER = re.compile(r"key|token|sig|secret|pass|pwd|auth|credential|session|code", re.I)
_PADDING = (0, 2, 3)  # base64 characters that depend on the bytes before a secret shifted by 0-2


class Secrets:
    """Every form of the secrets given, and `redact`, which blanks them in a text."""

    def __init__(self, *secrets: str | None):
        forms = {
            form
            for secret in secrets
            if secret and len(secret) >= SHORTEST
            for form in _forms(secret)
        }
        self.whole = sorted((f for f in forms if len(f) < FRAGMENT), key=len, reverse=True)
        self.grams = {f[i : i + FRAGMENT] for f in forms for i in range(len(f) - FRAGMENT + 1)}

    def __bool__(self) -> bool:
        return bool(self.whole or self.grams)

    def redact(self, text: str) -> str:
        """`text` with every run of FRAGMENT characters of a secret's form, and every short form
        whole, replaced by MASK (one MASK per run)."""
        for form in self.whole:
            text = text.replace(form, MASK)
        if not self.grams or len(text) < FRAGMENT:
            return text
        masked = [False] * len(text)
        for start in range(len(text) - FRAGMENT + 1):
            if text[start : start + FRAGMENT] in self.grams:
                masked[start : start + FRAGMENT] = [True] * FRAGMENT
        if not any(masked):
            return text
        pieces, previous = [], False
        for char, hidden in zip(text, masked, strict=True):
            if not hidden:
                pieces.append(char)
            elif not previous:
                pieces.append(MASK)
            previous = hidden
        return "".join(pieces)


@functools.lru_cache(maxsize=16)
def held(key: str | None, url: str | None) -> Secrets:
    """The secrets of a client of `url` with `key`: the key, the URL's password, its credentials
    (`user:password`, as a Basic header encodes them) and the secret values of its query."""
    return Secrets(key, *url_secrets(url or ""))


def url_secrets(url: str) -> list[str]:
    """The secrets a URL holds, both as written in it and decoded."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return []
    found = []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        user, _, password = userinfo.partition(":")
        found += [password, unquote(password), f"{unquote(user)}:{unquote(password)}", userinfo]
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_PARAMETER.search(name):
            found += [value, quote(value, safe=""), quote_plus(value)]
    return [secret for secret in found if secret]


def _forms(secret: str) -> set[str]:
    """A secret as given, URL-encoded, and base64 (standard and URL-safe): its whole encoding and,
    for each of the three alignments it can have inside a longer encoded text, the characters that
    depend on it alone."""
    raw = secret.encode()
    forms = {secret, quote(secret, safe=""), quote_plus(secret)}
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        forms.add(encode(raw).decode())
        for shift in range(3):
            encoded = encode(b"\0" * shift + raw).decode()
            inner = encoded[_PADDING[shift] : 4 * ((shift + len(raw)) // 3)]
            if len(inner) >= FRAGMENT:  # found by its runs; a shorter piece would match anything
                forms.add(inner)
    return forms
