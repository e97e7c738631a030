"""Redaction by value (farmkit/core/secrets.py): every secret an endpoint client holds, in every
form it may come back in, is blanked; text that holds none is left as it is."""

from __future__ import annotations

import base64
from urllib.parse import quote

import pytest

from farmkit.core.endpoint import redact
from farmkit.core.secrets import held, url_secrets

KEY = "sk-live-Xq81LmZ0pW4tR7vK"
PASSWORD = "p@ss w0rd/TOPSECRET"
URL = (
    f"https://alice:{quote(PASSWORD, safe='')}@gateway.example/v1"
    "?api-version=2024-06-01&api-key=AzUrEsEcReT123&sig=SAS%2Bsig%2Fvalue"
)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "leak",
    [
        KEY,
        quote(KEY, safe=""),
        _b64(KEY),
        base64.urlsafe_b64encode(KEY.encode()).decode(),
        "Basic " + _b64(f"apikey:{KEY}"),  # the key inside a longer base64 text, each alignment
        _b64(f"x:{KEY}"),
        _b64(f"xy:{KEY}"),
        KEY[3:15],  # a run of it, as an endpoint quotes a rejected key
        PASSWORD,
        quote(PASSWORD, safe=""),
        "Authorization: Basic " + _b64(f"alice:{PASSWORD}"),
        "AzUrEsEcReT123",
        _b64("AzUrEsEcReT123"),
        "SAS+sig/value",
        "SAS%2Bsig%2Fvalue",
    ],
)
def test_every_form_of_every_secret_is_blanked(leak):
    text = f"the gateway said: {leak} (request refused)"
    cleared = held(KEY, URL).redact(text)
    assert cleared.startswith("the gateway said: ") and cleared.endswith(" (request refused)")
    for secret in (KEY, PASSWORD, "AzUrEsEcReT123", "SAS+sig/value"):
        for form in (secret, _b64(secret), quote(secret, safe="")):
            assert form[:8] not in cleared, (leak, cleared)


def test_text_without_secrets_and_values_that_are_not_secrets_are_left_alone():
    text = "HTTP 400 from gateway.example: api-version=2024-06-01 is not supported; user alice"
    assert held(KEY, URL).redact(text) == text
    assert held(None, "http://127.0.0.1:8000/v1?api-version=2024-06-01").redact(text) == text
    # a secret too short to look for would blank every "ab" of every message
    assert held("ab", "http://u:xy@host/v1").redact("a tab, xyz") == "a tab, xyz"


def test_the_secrets_of_a_url_are_its_password_credentials_and_secret_query_values():
    found = url_secrets(URL)
    assert PASSWORD in found and f"alice:{PASSWORD}" in found
    assert "AzUrEsEcReT123" in found and "SAS+sig/value" in found
    assert not any("2024-06-01" in secret for secret in found)
    assert url_secrets("http://127.0.0.1:8000/v1") == []


def test_redact_also_blanks_the_shapes_of_credentials_it_does_not_hold():
    text = "Authorization: Basic Ym9iOmh1bnRlcjI= for https://bob:hunter2@other.example/v1?token=abc123&x=1"
    assert (
        redact(text, "unrelated-key-000")
        == "Authorization: *** for https://***@other.example/v1?token=***&x=1"
    )
