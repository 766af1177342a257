"""Relations between keys that single values cannot show: renew_interval against every
lease, handler slots against worker slots, the dashboard's login against its address, ..."""

from __future__ import annotations

import grp
import importlib.util
import pwd
from collections.abc import Callable

from pgworkerd.config.checks import is_loopback, size_text
from pgworkerd.config.model import Config
from pgworkerd.config.spec import ConfigError
from pgworkerd.config.tables import WorkerConfig
from pgworkerd.durations import format_duration

# What cross_check holds, in words (the reference's "Relations between keys"); keep in
# step with the checks below.
RULES = (
    "worker.renew_interval is at most a third of worker.lease and of every handler's "
    "lease, so a lease survives two missed renewals.",
    "worker.backoff_max is not shorter than worker.backoff.",
    "worker.job_uids holds at least worker.slots + worker.warm_children uids, none of "
    "them a user's or a group's on this host.",
    "A handler's queue (with worker.queues set and no handler queues) and each of its "
    "queues are among worker.queues: its jobs would never run here otherwise.",
    "A handler's slots are at most worker.slots; its heartbeat_timeout is not longer "
    "than its timeout.",
    "With worker.memory_budget every handler has a memory_estimate or a memory_limit (its "
    "own or the worker's), and that is not larger than the budget: its jobs would never "
    "be admitted here otherwise.",
    "metrics.listen needs prometheus-client installed (pip install 'pgworkerd[metrics]').",
    "web.bind other than a loopback address needs web.users; web.allow_anonymous "
    "contradicts web.users; web.action_dsn contradicts web.read_only; web.trusted_proxy "
    "needs web.users.",
)


def cross_check(config: Config, error: Callable[[str, str, str], ConfigError]) -> None:
    """Relations between keys that single values cannot show; `error(table, key,
    message)` makes the error, pointing at the key's line."""
    w = config.worker

    for h in [None, *config.handlers.values()]:
        lease = w.lease if h is None or h.lease is None else h.lease
        table = "worker" if h is None or h.lease is None else f"handlers.{h.name}"
        if w.renew_interval > lease / 3:
            raise error(
                "worker",
                "renew_interval",
                f"{format_duration(w.renew_interval)} must be at most a third of the lease "
                f"({format_duration(lease)} in [{table}]) so a lease survives two missed "
                "renewals",
            )
    if w.memory_budget is not None:
        for h in config.handlers.values():
            expected = h.memory_estimate or h.memory_limit or w.memory_limit
            if expected is None:
                raise error(
                    f"handlers.{h.name}",
                    "memory_estimate",
                    "is needed with [worker] memory_budget (or a memory_limit): what one job "
                    "of it is expected to use until its attempts have measured peaks",
                )
            if expected > w.memory_budget:
                raise error(
                    f"handlers.{h.name}",
                    "memory_estimate" if h.memory_estimate else "memory_limit",
                    f"{size_text(expected)} is larger than [worker] memory_budget "
                    f"({size_text(w.memory_budget)}): its jobs would never be admitted here",
                )
    if config.metrics.enabled and importlib.util.find_spec("prometheus_client") is None:
        raise error(
            "metrics",
            "listen",
            "the Prometheus endpoint needs prometheus-client, which is not installed "
            "(pip install 'pgworkerd[metrics]'); or leave listen empty",
        )
    if config.web.users == {} and not is_loopback(config.web.bind):
        raise error(
            "web",
            "bind",
            f"{config.web.bind!r} is not a loopback address: the dashboard needs [web.users] "
            "(a login) to listen there",
        )
    if config.web.users and config.web.allow_anonymous:
        raise error(
            "web",
            "allow_anonymous",
            "contradicts [web.users]: with users every page needs a login; remove one of them",
        )
    if config.web.action_dsn and config.web.read_only:
        raise error(
            "web",
            "action_dsn",
            "contradicts read_only: a read-only dashboard runs no action; remove one of them",
        )
    if config.web.trusted_proxy and not config.web.users:
        raise error(
            "web",
            "trusted_proxy",
            "needs [web.users]: a dashboard without a login never answers through a proxy",
        )
    if w.backoff_max < w.backoff:
        raise error("worker", "backoff_max", "must not be shorter than worker.backoff")
    if w.job_uids is not None:
        problem = _job_uids_problem(w)
        if problem:
            raise error("worker", "job_uids", problem)
    for h in config.handlers.values():
        if w.queues and not h.queues and h.queue not in w.queues:
            raise error(
                f"handlers.{h.name}",
                "queue",
                f"{h.queue!r} is not among worker.queues {list(w.queues)}: its jobs would "
                "never run here",
            )
        if w.queues and not set(h.queues) <= set(w.queues):
            raise error(
                f"handlers.{h.name}",
                "queues",
                f"{sorted(set(h.queues) - set(w.queues))} not among worker.queues "
                f"{list(w.queues)}: its jobs there would never run",
            )
        if h.weights and not h.fair:
            raise error(
                f"handlers.{h.name}",
                "weights",
                "weigh the turns of a fair handler: set fair = true, or remove weights",
            )
        if h.slots is not None and h.slots > w.slots:
            raise error(
                f"handlers.{h.name}", "slots", f"{h.slots} exceeds worker.slots ({w.slots})"
            )
        if (
            h.heartbeat_timeout is not None
            and h.timeout is not None
            and (h.heartbeat_timeout > h.timeout)
        ):
            raise error(
                f"handlers.{h.name}",
                "heartbeat_timeout",
                "is longer than timeout, so it would never apply",
            )


def _job_uids_problem(w: WorkerConfig) -> str | None:
    """Why worker.job_uids cannot be used with these settings: too few uids for the
    children that live at once, or uids (or gids: a child's gid is its uid) of accounts
    or groups this host has, whose files and processes a job would own."""
    assert w.job_uids is not None
    first, last = w.job_uids
    size, needed = last - first + 1, w.slots + w.warm_children
    if size < needed:
        return (
            f"{size} uid(s) for {needed} children at once (slots {w.slots} + warm_children "
            f"{w.warm_children}): widen the range (twice that leaves room for children "
            "still exiting)"
        )
    users = sorted((u.pw_uid, u.pw_name) for u in pwd.getpwall() if first <= u.pw_uid <= last)
    if users:
        uid, name = users[0]
        return f"uid {uid} belongs to the user {name!r}: choose a range no account uses"
    groups = sorted((g.gr_gid, g.gr_name) for g in grp.getgrall() if first <= g.gr_gid <= last)
    if groups:
        gid, name = groups[0]
        return (
            f"gid {gid} belongs to the group {name!r} (a job's gid is its uid): choose a "
            "range no account or group uses"
        )
    return None
