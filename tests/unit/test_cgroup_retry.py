"""An attempt cgroup that could not be removed when its child was reaped (a process the
machine has not let die yet) is tried again on the daemon's tick, every RETRY_LEFT
seconds, until it is gone: not only at the next reaping, which may never come."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgworkerd.daemon import cgroups
from pgworkerd.daemon.cgroups import RETRY_LEFT, JobCgroups
from pgworkerd.daemon.containment import Containment
from pgworkerd.worker import cgroup


def test_a_cgroup_left_at_the_reaping_is_removed_on_a_later_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = cgroup.attempt_name(7, 1, 4242)
    (tmp_path / name).mkdir()
    busy = {"tries": 0}

    def remove(path: str, wait: float = 0.0) -> bool:
        busy["tries"] += 1
        if busy["tries"] < 3:  # still populated the first two times
            return False
        Path(path).rmdir()
        return True

    monkeypatch.setattr(cgroup, "remove", remove)
    clock = {"now": 1000.0}
    monkeypatch.setattr(cgroups.time, "monotonic", lambda: clock["now"])
    jc = JobCgroups(str(tmp_path), memory=False, cgroup_kill=True)
    containment = Containment(traversable=False, cgroups=jc)
    assert containment.next_deadline() is None

    containment.child_exited(4242)  # reaped: one try, the cgroup is busy
    assert busy["tries"] == 1 and (tmp_path / name).exists()
    assert containment.next_deadline() == 1000.0 + RETRY_LEFT

    containment.tick(1000.0 + RETRY_LEFT / 2)  # not due yet
    assert busy["tries"] == 1
    containment.tick(1000.0 + RETRY_LEFT)  # due: busy again, the next try later
    assert busy["tries"] == 2 and containment.next_deadline() == 1000.0 + 2 * RETRY_LEFT
    containment.tick(1000.0 + 2 * RETRY_LEFT)  # gone
    assert busy["tries"] == 3 and not (tmp_path / name).exists()
    assert containment.next_deadline() is None
    containment.tick(1000.0 + 10 * RETRY_LEFT)  # nothing left: no more tries
    assert busy["tries"] == 3
