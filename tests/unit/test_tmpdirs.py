"""Unit tier: an attempt's temp directory is given to the next attempt of a reused child
only as it was made (empty, this uid's, mode 0700, a directory); else a new one."""

from __future__ import annotations

import os
from pathlib import Path

from pgworkerd.worker import tmpdirs


def test_an_empty_directory_as_made_is_given_again(tmp_path: Path) -> None:
    first = tmpdirs.prepare(str(tmp_path))
    assert first is not None
    assert tmpdirs.renew(first, str(tmp_path)) == first


def test_anything_left_or_changed_gets_a_new_directory_and_the_old_one_goes(
    tmp_path: Path,
) -> None:
    def left_file(p: str) -> None:
        Path(p, "secret").write_text("x")

    def left_dir(p: str) -> None:
        os.mkdir(os.path.join(p, "sub"))

    def opened_up(p: str) -> None:
        os.chmod(p, 0o777)

    def swapped_for_a_link(p: str) -> None:
        os.rmdir(p)
        os.symlink(str(tmp_path), p)

    for change in (left_file, left_dir, opened_up, swapped_for_a_link):
        used = tmpdirs.prepare(str(tmp_path))
        assert used is not None
        change(used)
        fresh = tmpdirs.renew(used, str(tmp_path))
        assert fresh is not None and fresh != used, change.__name__
        assert not os.path.lexists(used), change.__name__
        assert os.listdir(fresh) == [] and (os.stat(fresh).st_mode & 0o777) == 0o700
