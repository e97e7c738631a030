"""farmkit.core.values (the one check of a number: finite, of its kind, in its range), the YAML
every tool reads (no aliases), and meta.json (valid JSON, never NaN)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from farmkit.core.values import (
    AT_LEAST_ONE,
    FRACTION,
    POSITIVE,
    UNBOUNDED,
    Bounds,
    check_number,
    finite_json,
)
from farmkit.core.yamltext import safe_yaml


@pytest.mark.parametrize(
    ("value", "kind", "bounds", "expected"),
    [
        ("1e-5", float, POSITIVE, 1e-5),
        (3, float, POSITIVE, 3.0),
        ("2", int, AT_LEAST_ONE, 2),
        (2.0, int, AT_LEAST_ONE, 2),  # a whole float is the count it writes
        ("12345678901234567891", int, UNBOUNDED, 12345678901234567891),  # not rounded by float()
        (0.5, float, FRACTION, 0.5),
        (-7, int, UNBOUNDED, -7),
    ],
)
def test_good_numbers_come_back_as_their_kind(value, kind, bounds, expected):
    number = check_number(value, kind, bounds)
    assert number == expected and type(number) is kind


@pytest.mark.parametrize(
    ("value", "kind", "bounds", "message"),
    [
        ("nan", float, UNBOUNDED, "'nan' is not a finite number"),
        (float("inf"), float, POSITIVE, "inf is not a finite number > 0"),
        ("-inf", float, UNBOUNDED, "'-inf' is not a finite number"),
        ("1e999", float, UNBOUNDED, "'1e999' is not a finite number"),  # overflows to inf
        (0, float, POSITIVE, "0 is not a finite number > 0"),
        (1.5, int, AT_LEAST_ONE, "1.5 is not a whole number >= 1"),
        ("1.5", int, AT_LEAST_ONE, "'1.5' is not a whole number >= 1"),
        (True, int, UNBOUNDED, "True is not a whole number"),
        ([1], float, POSITIVE, r"\[1\] is not a finite number > 0"),
        ({"a": 1}, float, UNBOUNDED, "is not a finite number"),
        (None, float, UNBOUNDED, "None is not a finite number"),
        ("many", int, UNBOUNDED, "'many' is not a whole number"),
        (0.6, float, Bounds(0, 0.5), r"0.6 is not a finite number in \[0, 0.5\]"),
        (1, float, Bounds(0, 1, max_open=True), r"1 is not a finite number in \[0, 1\)"),
        (0, float, Bounds(0, 1, min_open=True), r"0 is not a finite number in \(0, 1\]"),
    ],
)
def test_bad_numbers_say_what_was_expected(value, kind, bounds, message):
    with pytest.raises(ValueError, match=message):
        check_number(value, kind, bounds)


BOMB = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
description: [*c, *c, *c, *c, *c, *c, *c, *c, *c]
"""


def test_yaml_aliases_are_refused_with_their_line():
    with pytest.raises(Exception, match=r"(?s)found an alias \(\*a\).*line 2") as caught:
        safe_yaml(BOMB)
    import yaml

    assert isinstance(caught.value, yaml.YAMLError)
    assert safe_yaml("a: 1\nb: [x, y]\n") == {"a": 1, "b": ["x", "y"]}


def test_an_alias_bomb_in_a_pool_file_is_refused_naming_the_file(tmp_path, capsys):
    from farmkit.tools.farm_annotate import main

    pool = tmp_path / "bomb.yaml"
    pool.write_text(
        BOMB.replace("description", "name: bomb\ndescription")
        + "judges:\n  - {name: g, backend: oracle, reward: heuristic}\n"
    )
    with pytest.raises(SystemExit) as exited:
        main(["--pool", str(pool), str(tmp_path / "none.jsonl")])
    error = capsys.readouterr().err
    assert exited.value.code == 1
    assert f"{pool}: not valid YAML" in error
    assert "found an alias (*a)" in error and "Traceback" not in error


def test_an_alias_in_a_config_file_is_a_usage_error(tmp_path):
    from farmkit.tools.farm_dpo import cli

    config = tmp_path / "dpo.yaml"
    config.write_text("beta: &b 0.2\nlabel_smoothing: *b\n")
    result = CliRunner().invoke(cli, ["sft", "prefs", "-o", "out", "--config", str(config)])
    assert result.exit_code == 2
    assert f"{config}: not valid YAML" in result.output and "found an alias (*b)" in result.output


def test_an_alias_in_a_price_table_is_refused(tmp_path):
    from farmkit.annotate.cost import PriceTable
    from farmkit.core.io import FarmError

    prices = tmp_path / "prices.yaml"
    prices.write_text("m: &p {prompt: 1, completion: 2}\nn: *p\n")
    with pytest.raises(FarmError, match=f"{prices}: cannot read the price table.*alias"):
        PriceTable.from_file(str(prices), {})


def test_meta_json_never_holds_nan(tmp_path):
    from farmkit.lm.modelio import write_meta

    meta = {"config": {"beta": 0.1}, "metrics": [{"eval_accuracy": math.nan, "loss": math.inf}]}
    write_meta(tmp_path, meta)
    text = (tmp_path / "meta.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["metrics"] == [{"eval_accuracy": None, "loss": None}]
    assert finite_json((1.0, -math.inf, {"x": [math.nan]})) == [1.0, None, {"x": [None]}]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": math.nan}, "temperature: nan is not a finite number >= 0"),
        ({"top_p": 0}, r"top_p: 0 is not a finite number in \(0, 1\]"),
        ({"n": 1.5}, "n: 1.5 is not a whole number >= 1"),
        ({"max_new_tokens": math.inf}, "max_new_tokens: inf is not a whole number >= 1"),
    ],
)
def test_decoding_settings_built_in_python_are_checked_as_their_options(settings, message):
    from farmkit.lm.generation import DecodingConfig

    with pytest.raises(ValueError, match=message):
        DecodingConfig(**settings)
