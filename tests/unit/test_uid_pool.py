"""The daemon's pool of job uids ([worker] job_uids, pgworkerd.daemon.jobuids)."""

from __future__ import annotations

from pgworkerd.daemon.jobuids import UidPool


def test_a_uid_is_held_by_one_child_at_a_time_and_reused_last() -> None:
    pool = UidPool(61000, 61003)
    first = pool.take(3)
    assert first == [61000, 61001, 61002] and pool.free() == 1
    assert pool.take(5) == [61003] and pool.take(1) == []  # none left: no child spawned
    pool.give_back(61001)
    pool.give_back(61000)
    # least recently used first: what the uid's last child left had the longest to go
    assert pool.take(2) == [61001, 61000]


def test_a_uid_given_back_twice_or_never_taken_is_not_handed_out_twice() -> None:
    pool = UidPool(61000, 61001)
    [uid] = pool.take(1)
    pool.give_back(uid)
    pool.give_back(uid)  # (a child forgotten, then reaped)
    pool.give_back(None)
    pool.give_back(99)
    assert sorted(pool.take(5)) == [61000, 61001]
