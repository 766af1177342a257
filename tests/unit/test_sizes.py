"""Unit tests of memory sizes (config values and messages) and of the job tree's
measurements (pgworkerd.worker.resources) on real processes of this test."""

from __future__ import annotations

import subprocess
import sys

import pytest
from daemon_harness import wait_for

from pgworkerd.config import ConfigError, parse_config
from pgworkerd.sizes import format_size, parse_size
from pgworkerd.worker.resources import Meter, descendants, limit_message

MIB = 1 << 20


@pytest.mark.parametrize(
    ("text", "size"),
    [("2GiB", 2 << 30), ("2G", 2 << 30), ("512MiB", 512 * MIB), ("1.5gb", 3 << 29), (MIB, MIB)],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("2XB", "is not a size"),
        ("-2GiB", "is negative"),
        (-5, "is negative"),
        ("9999TiB", "out of range"),
        (10**30, "out of range"),
        ("2", "too small"),
        ("", "is not a size"),
        ("GiB", "is not a size"),
    ],
)
def test_parse_size_rejects(text: str | int, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_size(text)


def test_memory_settings_are_read_and_bad_ones_are_one_line_errors() -> None:
    config = parse_config(
        '[worker]\nmemory_limit = "1GiB"\nmax_child_memory = "300MiB"\n'
        '[handlers.h]\ntarget = "m:f"\nmemory_limit = "2GiB"\n'
    )
    assert (config.worker.memory_limit, config.worker.max_child_memory) == (1 << 30, 300 * MIB)
    assert config.handlers["h"].memory_limit == 2 << 30
    with pytest.raises(ConfigError) as info:
        parse_config('[handlers.h]\ntarget = "m:f"\nmemory_limit = true\n', "c.toml")
    assert (
        str(info.value)
        == 'c.toml:3: handlers.h.memory_limit: expected a size like "2GiB", got bool True'
    )


def test_sizes_in_messages() -> None:
    assert format_size(2 << 30) == "2 GiB"
    assert format_size(2.1 * (1 << 30)) == "2.1 GiB"
    assert (
        limit_message(2 << 30, int(2.1 * (1 << 30))) == "memory limit 2 GiB exceeded (peak 2.1 GiB)"
    )
    # a peak that rounds to the limit is shown precisely enough to differ from it
    assert (
        limit_message(2 << 30, (2 << 30) + 10 * MIB)
        == "memory limit 2 GiB exceeded (peak 2058 MiB)"
    )


def test_the_meter_sees_a_descendant_in_a_session_of_its_own() -> None:
    code = "import time; b = bytearray(80 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    meter = Meter(first_job=False)
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        assert proc.pid in descendants(meter.pid)
        wait_for(lambda: meter.sample() > 80 * MIB, timeout=20, what="the subprocess's 80 MiB")
        assert meter.figures().peak_memory > 80 * MIB
    finally:
        proc.kill()
        proc.wait()
