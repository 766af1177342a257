"""The dashboard's login throttling and server-side sessions, both in memory.

Throttling answers at once (429 with Retry-After) and never sleeps in a server thread:
waitress has a handful of threads, and a delay held in one of them is a delay for every
page. Budgets of failed logins:

Each budget counts a check when it begins (two checks in flight cannot share the last
token) and gives it back when it succeeds:

- per user name, whatever the address: a token bucket (NAME_BURST failures, then one per
  NAME_REFILL seconds). A local account can send from any address of 127.0.0.0/8 (and a
  botnet from many), so only a budget of the name bounds the guesses against it. Every
  name has its own, known or not: were unknown names treated apart, an attacker could
  tell them from known ones by whose budget runs out.
- all names together, whatever the address: a token bucket (ALL_BURST, then one per
  ALL_REFILL seconds), which bounds the password checks (scrypt: CPU and memory) that
  rotating both names and addresses would buy.
- per (user name, client address): a few free failures, then a lockout that doubles with
  each further failure (up to PAIR_LOCK_MAX), for that name from that address only.
- per client address, whatever the name: a token bucket (ADDRESS_BURST failures, then one
  per ADDRESS_REFILL seconds), so one address cannot try many names. IPv6 addresses count
  by their /64 (one host usually holds a whole /64).

A budget shared by everyone can be spent by an attacker: then the name's real user would
be locked out with them. So a successful login gives the browser a device token (an
HttpOnly cookie naming a random id the server keeps, OWASP's "device cookies"): a login
for that name that brings it skips the shared budgets and spends only the device's own
(DEVICE_FREE_FAILURES failures, then the token is forgotten). An attacker cannot make one
without the password, so a user who has logged in from a browser before still logs in
from it while someone else guesses their password. No address is trusted instead: on
loopback an attacker can send from the user's own address.

Unknown user names cost the same as known ones (the caller verifies against a dummy
hash), so timing does not tell which names exist. Every table is bounded: the oldest
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
# Failures of one name from anywhere (without a device token for it): a burst, then one
# per refill interval (3 a minute: ~4,300 guesses a day at most, against any password).
NAME_BURST = 10
NAME_REFILL = 20.0
# Failures of all names together from anywhere (without a device token): a burst, then
# one a second.
ALL_BURST = 100
ALL_REFILL = 1.0
# Failed logins that bring a device token before the token is forgotten.
DEVICE_FREE_FAILURES = 5
# Device tokens kept at most (a login makes one): the least recently used go first. And
# per user name: that name's least recently used go first, so that one user logging in
# over and over cannot push the other users' tokens out.
MAX_DEVICES = 10_000
MAX_DEVICES_PER_USER = 50
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
    """A token bucket of failures: `burst` at most, one more every `refill` seconds."""

    tokens: float
    at: float

    def refilled(self, now: float, burst: int, refill: float) -> _Bucket:
        self.tokens = min(float(burst), self.tokens + (now - self.at) / refill)
        self.at = now
        return self

    def wait(self, refill: float) -> float:
        """Seconds until a whole token is there (0: one is)."""
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) * refill


class _Buckets:
    """Token buckets by key, at most MAX_ENTRIES (the least recently spent go first;
    a key not here has a full bucket). Callers hold the throttle's lock."""

    def __init__(self, burst: int, refill: float) -> None:
        self.burst = burst
        self.refill = refill
        self._by_key: OrderedDict[str, _Bucket] = OrderedDict()

    def wait(self, key: str, now: float) -> float:
        bucket = self._by_key.get(key)
        return (
            0.0
            if bucket is None
            else bucket.refilled(now, self.burst, self.refill).wait(self.refill)
        )

    def spend(self, key: str, now: float) -> None:
        bucket = self._by_key.pop(key, None) or _Bucket(float(self.burst), now)
        bucket.refilled(now, self.burst, self.refill)
        bucket.tokens = max(0.0, bucket.tokens - 1)
        self._by_key[key] = bucket  # (re)inserted last: the newest
        while len(self._by_key) > MAX_ENTRIES:
            self._by_key.popitem(last=False)

    def give_back(self, key: str, now: float) -> None:
        bucket = self._by_key.get(key)
        if bucket is not None:
            bucket.refilled(now, self.burst, self.refill)
            bucket.tokens = min(float(self.burst), bucket.tokens + 1)

    def __len__(self) -> int:
        return len(self._by_key)


class LoginThrottle:
    """Login budgets. `begin` before checking a password counts the check in every budget
    at once (two checks in flight cannot share the last token); after it, `failed` (it
    stays counted), or `give_back` (it succeeded or was not made: only failures count).
    Thread-safe; `clock` is time.monotonic unless a test passes one."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pairs: OrderedDict[tuple[str, str], _Pair] = OrderedDict()
        self._addresses = _Buckets(ADDRESS_BURST, ADDRESS_REFILL)
        self._names = _Buckets(NAME_BURST, NAME_REFILL)
        self._all = _Buckets(ALL_BURST, ALL_REFILL)

    def begin(self, user: str, address: str | None) -> float:
        """Seconds until this name may be tried from this address; 0: now, and this
        check is counted in every budget (until `give_back`)."""
        key = address_key(address)
        now = self._clock()
        with self._lock:
            pair = self._pairs.get((user, key))
            wait = max(
                max(0.0, pair.locked_until - now) if pair else 0.0,
                self._addresses.wait(key, now),
                self._names.wait(user, now),
                self._all.wait("", now),
            )
            if wait <= 0:
                self._addresses.spend(key, now)
                self._names.spend(user, now)
                self._all.spend("", now)
            return wait

    def failed(self, user: str, address: str | None) -> None:
        """The check begun was a failure: it stays counted, and the pair's failures grow."""
        key = address_key(address)
        now = self._clock()
        with self._lock:
            pair = self._pairs.pop((user, key), None) or _Pair()
            pair.failures += 1
            over = pair.failures - PAIR_FREE_FAILURES
            if over > 0:
                pair.locked_until = now + min(PAIR_LOCK_MAX, PAIR_LOCK_FIRST * 2 ** (over - 1))
            self._pairs[(user, key)] = pair  # (re)inserted last: the newest
            while len(self._pairs) > MAX_ENTRIES:
                self._pairs.popitem(last=False)

    def succeeded(self, user: str, address: str | None) -> None:
        """A login as `user` from `address` succeeded: the pair's lockout is cleared."""
        with self._lock:
            self._pairs.pop((user, address_key(address)), None)

    def give_back(self, user: str, address: str | None) -> None:
        """The check `begin` counted succeeded or was not made: it no longer counts. Only
        that check: a real user logging in now and then does not refill the name's
        budget for someone guessing."""
        key = address_key(address)
        now = self._clock()
        with self._lock:
            self._addresses.give_back(key, now)
            self._names.give_back(user, now)
            self._all.give_back("", now)


@dataclass
class _Device:
    user: str
    failures: int = 0


class Devices:
    """Device tokens: a random id given to a browser at a successful login, good for
    that user name's logins (they skip the shared budgets) until DEVICE_FREE_FAILURES
    failed logins bring it, or it is the least recently used of MAX_DEVICES. In memory:
    a restart forgets them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, _Device] = OrderedDict()

    def trusted(self, token: object, user: str) -> bool:
        """Whether `token` (the cookie's value, anything) was given at a login as `user`."""
        if not isinstance(token, str):
            return False
        with self._lock:
            found = self._by_id.get(token)
            return found is not None and found.user == user

    def issue(self, token: object, user: str) -> str:
        """The token to give the browser after a login as `user`: the one it brought if
        that was for `user` (its failures forgiven), else a new one."""
        with self._lock:
            found = self._by_id.get(token) if isinstance(token, str) else None
            if isinstance(token, str) and found is not None and found.user == user:
                found.failures = 0
                self._by_id.move_to_end(token)
                return token
            new = secrets.token_urlsafe(32)
            self._by_id[new] = _Device(user)
            mine = [t for t, d in self._by_id.items() if d.user == user]  # oldest first
            for old in mine[: max(0, len(mine) - MAX_DEVICES_PER_USER)]:
                del self._by_id[old]
            while len(self._by_id) > MAX_DEVICES:
                self._by_id.popitem(last=False)
            return new

    def failed(self, token: object) -> None:
        if not isinstance(token, str):
            return
        with self._lock:
            found = self._by_id.get(token)
            if found is not None:
                found.failures += 1
                if found.failures >= DEVICE_FREE_FAILURES:
                    del self._by_id[token]

    def __len__(self) -> int:
        return len(self._by_id)


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
