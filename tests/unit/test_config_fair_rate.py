"""[handlers.X] fair, weights, rate and rate_per_key (claim_v4, schema 33): what the claim
gets from the file, and every absurd value refused at config time, naming the key."""

from __future__ import annotations

import pytest

from pgworkerd.config import ConfigError, parse_config
from pgworkerd.config.handlers import HandlerConfig

BASE = """
[database]
dsn = "postgresql:///x"
[handlers.h]
target = "pgworkerd.examples:sleep_with_progress"
"""


def handler(extra: str) -> HandlerConfig:
    return parse_config(BASE + extra + "\n").handlers["h"]


def test_unset_is_todays_behaviour() -> None:
    h = handler("")
    assert (h.fair, h.weights, h.rate, h.rate_per_key) == (False, {}, None, None)


@pytest.mark.parametrize(
    "written, per_second",
    [("20/m", 20 / 60), ("2/s", 2.0), ("0.5/h", 0.5 / 3600), (" 3/m ", 3 / 60)],
)
def test_rates_in_each_unit(written: str, per_second: float) -> None:
    h = handler(f'rate = "{written}"\nrate_per_key = "{written}"')
    assert h.rate is not None and h.rate_per_key is not None
    assert h.rate.per_second == pytest.approx(per_second)
    assert h.rate_per_key.per_second == pytest.approx(per_second)
    assert str(h.rate) == written.strip()


@pytest.mark.parametrize(
    "written, says",
    [
        ('"0/s"', "above 0"),
        ('"0.0/m"', "above 0"),
        ('"-1/m"', "starts per unit"),
        ('"1e12/s"', "starts per unit"),
        ('"2000000/s"', "at most"),
        ('"NaN/s"', "starts per unit"),
        ('"inf/s"', "starts per unit"),
        ('"3/d"', "unknown unit"),
        ('"3/minute"', "unknown unit"),
        ('"20"', "starts per unit"),
        ("20", "expected a string"),
    ],
)
@pytest.mark.parametrize("name", ["rate", "rate_per_key"])
def test_absurd_rates_are_refused(name: str, written: str, says: str) -> None:
    with pytest.raises(ConfigError, match=rf"handlers\.h\.{name}: .*{says}"):
        handler(f"{name} = {written}")


def test_weights_of_a_fair_handler() -> None:
    h = handler('fair = true\nweights = { "big" = 3, "customer:7" = 1000 }')
    assert h.fair and h.weights == {"big": 3, "customer:7": 1000}


@pytest.mark.parametrize(
    "weights, says",
    [
        ("{ a = 0 }", "from 1 to 1000"),
        ("{ a = -2 }", "from 1 to 1000"),
        ("{ a = 1001 }", "from 1 to 1000"),
        ("{ a = 1.5 }", "whole number"),
        ("{ a = nan }", "whole number"),
        ('{ a = "3" }', "whole number"),
        ('{ " a" = 3 }', "not a concurrency key"),
        ('{ "" = 3 }', "not a concurrency key"),
        ("3", "expected a table"),
    ],
)
def test_absurd_weights_are_refused(weights: str, says: str) -> None:
    with pytest.raises(ConfigError, match=rf"handlers\.h\.weights: .*{says}"):
        handler(f"fair = true\nweights = {weights}")


def test_too_many_weights_are_refused() -> None:
    many = ", ".join(f'"k{n}" = 1' for n in range(10_001))
    with pytest.raises(ConfigError, match="at most 10000 keys"):
        handler(f"fair = true\nweights = {{ {many} }}")


def test_weights_without_fair_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"handlers\.h\.weights: .*set fair = true"):
        handler("weights = { a = 2 }")
