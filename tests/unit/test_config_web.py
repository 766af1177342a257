"""The [web] table: defaults, values, and one-line errors for hostile values (a password
where a hash belongs is never echoed)."""

from __future__ import annotations

import pytest

from pgworkerd.config import ConfigError, WebConfig, parse_config
from pgworkerd.web.passwords import hash_password, hash_problem, verify

HASH = hash_password("a long enough password")


def test_defaults_listen_on_loopback_without_login() -> None:
    web = parse_config("").web
    assert web == WebConfig()
    assert (web.bind, web.port, web.users, web.read_only) == ("127.0.0.1", 8470, {}, False)


def test_values_are_read() -> None:
    web = parse_config(
        f'[web]\nbind = "0.0.0.0"\nport = 9000\nread_only = true\nstatement_timeout = "2s"\n'
        f'pool_size = 8\nsecure_cookie = true\n[web.users]\nalice = "{HASH}"\n'
    ).web
    assert web == WebConfig("0.0.0.0", 9000, {"alice": HASH}, True, 2.0, 8, True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('bind = "0.0.0.0"', "web.bind: '0.0.0.0' is not a loopback address"),
        ('bind = "host name; rm -rf /"', "web.bind: expected a host name or an IP address"),
        ("port = 70000", "web.port: must be at most 65535"),
        ('port = "80"', "web.port: expected an integer"),
        ("pool_size = 0", "web.pool_size: must be at least 1"),
        ("pool_size = 1000", "web.pool_size: must be at most 100"),
        ('statement_timeout = "0s"', "web.statement_timeout: must be longer than zero"),
        ('statement_timeout = "30d"', "web.statement_timeout: '30d' is out of range"),
        ('read_only = "yes"', "web.read_only: expected true or false"),
        ("users = 5", "web.users: expected a table of NAME = HASH"),
        ('users = { "a\\u001b[2J" = "x" }', "web.users: user must not contain control"),
        ("colour = 1", "web.colour: unknown key"),
    ],
)
def test_hostile_values_fail_with_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"[web]\n{text}\n", "/etc/pgworkerd.toml")
    error = str(info.value)
    assert "\n" not in error and error.startswith("/etc/pgworkerd.toml:")
    assert message in error


def test_a_password_in_place_of_a_hash_is_refused_and_never_shown() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config('[web.users]\nalice = "hunter2hunter2"\n', "c.toml")
    assert "not a password hash" in str(info.value) and "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    "hashed",
    [
        "scrypt$1048576000$8$1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==",  # hours per login
        "scrypt$16384$8$1$!!$aGFzaGhhc2hoYXNoaGFzaA==",
        "scrypt$16383$8$1$c2FsdHNhbHQ=$aGFzaGhhc2hoYXNoaGFzaA==",
        "md5$abc",
    ],
)
def test_a_hash_with_hostile_parameters_is_refused(hashed: str) -> None:
    assert hash_problem(hashed)


def test_hash_and_verify() -> None:
    assert hash_problem(HASH) is None
    assert verify("a long enough password", HASH)
    assert not verify("a long enough passworD", HASH)
    assert hash_password("same") != hash_password("same")  # salted


def test_no_login_and_idle_timeout_are_read() -> None:
    web = parse_config('[web]\nallow_anonymous = true\nidle_timeout = "10m"\n').web
    assert (web.allow_anonymous, web.idle_timeout) == (True, 600.0)
    assert (WebConfig().allow_anonymous, WebConfig().idle_timeout) == (False, 1800.0)
    for text, message in [
        ('idle_timeout = "5s"', "web.idle_timeout: must be from 1m to 12h"),
        ('idle_timeout = "2d"', "web.idle_timeout: must be from 1m to 12h"),
        ('allow_anonymous = "yes"', "web.allow_anonymous: expected true or false"),
        (
            f'allow_anonymous = true\n[web.users]\nalice = "{HASH}"',
            "web.allow_anonymous: contradicts [web.users]",
        ),
    ]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_config(f"[web]\n{text}\n", "c.toml")


def test_trusted_proxy_is_an_address_and_needs_users() -> None:
    web = parse_config(f'[web]\ntrusted_proxy = "127.0.0.1"\n[web.users]\na = "{HASH}"\n').web
    assert web.trusted_proxy == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"web\.trusted_proxy: expected an IP address"):
        parse_config('[web]\ntrusted_proxy = "proxy.example"\n', "c.toml")
    with pytest.raises(ConfigError, match=r"web.trusted_proxy: needs \[web.users\]"):
        parse_config('[web]\ntrusted_proxy = "127.0.0.1"\n', "c.toml")


def test_action_dsn_is_read_masked_and_contradicts_read_only() -> None:
    from pgworkerd.config import effective

    config = parse_config(
        '[web]\naction_dsn = "postgresql://pgworkerd_operator:s3cret-pass@db/app"\n'
    )
    assert config.web.action_dsn == "postgresql://pgworkerd_operator:s3cret-pass@db/app"
    assert "s3cret-pass" not in str(effective(config))  # check-config shows it masked
    assert WebConfig().action_dsn == ""
    with pytest.raises(ConfigError, match=r"web\.action_dsn: contradicts read_only"):
        parse_config('[web]\nread_only = true\naction_dsn = "dbname=app"\n', "c.toml")
    with pytest.raises(ConfigError, match=r"web\.action_dsn: expected a string"):
        parse_config("[web]\naction_dsn = 5\n", "c.toml")
