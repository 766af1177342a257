"""The dashboard's login throttling and server-side sessions, both in memory.

Throttling answers at once (429 with Retry-After) and never sleeps in a server thread:
waitress has a handful of threads, and a delay held in one of them is a delay for every
page. Two budgets, both counting failed logins only:

- per (user name, client address): a few free failures, then a lockout that doubles with
  each further failure (up to PAIR_LOCK_MAX). It locks that name from that address only,
  so an attacker cannot lock a real user out: a correct password from another address
  still works.
- per client address, whatever the name: a token bucket (ADDRESS_BURST failures, then one
  per ADDRESS_REFILL seconds), so one address cannot try many names. IPv6 addresses count
  by their /64 (one host usually holds a whole /64).

Unknown user names cost the same as known ones (the caller verifies against a dummy
hash), so timing does not tell which names exist. Both tables are bounded: the oldest
entries go first when full.
"""

from __future__ import annotations

import ipaddress
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# Failures of one name from one address before it is locked out.
PAIR_FREE_FAILURES = 5
# The lockout after the next failure, doubling with each further one, up to the max.
PAIR_LOCK_FIRST = 2.0
PAIR_LOCK_MAX = 15 * 60.0
# Failures of any name from one address: a burst, then one per refill interval.
ADDRESS_BURST = 20
ADDRESS_REFILL = 30.0
# Entries kept at most in each table (an attacker with many addresses fills them: the
# oldest, least recently failed, go first).
MAX_ENTRIES = 20_000
# A login lasts this long at most whatever the activity (idle_timeout ends it sooner).
SESSION_MAX_AGE = 12 * 3600.0
# Sessions kept at most (a login makes one): the least recently used go first.
MAX_SESSIONS = 10_000


def address_key(address: str | None) -> str:
    """The throttled unit of a client address: the address, an IPv6 one by its /64."""
    if not address:
        return "?"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:100]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class _Pair:
    failures: int = 0
    locked_until: float = 0.0


@dataclass
class _Bucket:
    tokens: float
    at: float


class LoginThrottle:
    """Failed-login budgets; `retry_after` before checking a password, `failed` or
    `succeeded` after. Thread-safe; `clock` is time.monotonic unless a test passes one."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pairs: OrderedDict[tuple[str, str], _Pair] = OrderedDict()
        self._addresses: OrderedDict[str, _Bucket] = OrderedDict()

    def _bucket(self, key: str, now: float) -> _Bucket:
        bucket = self._addresses.get(key)
        if bucket is None:
            return _Bucket(float(ADDRESS_BURST), now)
        bucket.tokens = min(ADDRESS_BURST, bucket.tokens + (now - bucket.at) / ADDRESS_REFILL)
        bucket.at = now
        return bucket

    def retry_after(self, user: str, address: str | None) -> float:
        """Seconds until this name may be tried from this address (0: now)."""
        key = address_key(address)
        now = self._clock()
        with self._lock:
            pair = self._pairs.get((user, key))
            wait = max(0.0, pair.locked_until - now) if pair else 0.0
            bucket = self._bucket(key, now)
            if bucket.tokens < 1:
                wait = max(wait, (1 - bucket.tokens) * ADDRESS_REFILL)
        return wait

    def failed(self, user: str, address: str | None) -> None:
        key = address_key(address)
        now = self._clock()
        with self._lock:
            pair = self._pairs.pop((user, key), None) or _Pair()
            pair.failures += 1
            over = pair.failures - PAIR_FREE_FAILURES
            if over > 0:
                pair.locked_until = now + min(PAIR_LOCK_MAX, PAIR_LOCK_FIRST * 2 ** (over - 1))
            self._pairs[(user, key)] = pair  # (re)inserted last: the newest
            bucket = self._bucket(key, now)
            bucket.tokens = max(0.0, bucket.tokens - 1)
            self._addresses.pop(key, None)
            self._addresses[key] = bucket
            while len(self._pairs) > MAX_ENTRIES:
                self._pairs.popitem(last=False)
            while len(self._addresses) > MAX_ENTRIES:
                self._addresses.popitem(last=False)

    def succeeded(self, user: str, address: str | None) -> None:
        with self._lock:
            self._pairs.pop((user, address_key(address)), None)


@dataclass
class Session:
    user: str
    created: float
    last_seen: float


class Sessions:
    """Logged-in sessions by random id: the cookie holds only the id, so logging out (or
    an idle timeout, or the maximum age) ends a session on the server, and a copy of the
    cookie is worth nothing afterwards."""

    def __init__(self, idle_timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_timeout = idle_timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def start(self, user: str) -> str:
        sid = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._by_id[sid] = Session(user, now, now)
            while len(self._by_id) > MAX_SESSIONS:
                self._by_id.popitem(last=False)
        return sid

    def user(self, sid: object) -> str | None:
        """The session's user, its idle clock restarted; None: no such session (never
        made, ended, idle too long or too old)."""
        if not isinstance(sid, str):
            return None
        now = self._clock()
        with self._lock:
            found = self._by_id.get(sid)
            if found is None:
                return None
            if now - found.last_seen > self.idle_timeout or now - found.created > SESSION_MAX_AGE:
                del self._by_id[sid]
                return None
            found.last_seen = now
            self._by_id.move_to_end(sid)
            return found.user

    def end(self, sid: object) -> None:
        if isinstance(sid, str):
            with self._lock:
                self._by_id.pop(sid, None)

    def __len__(self) -> int:
        return len(self._by_id)
