"""Masking passwords in DSN-like text, and in the process's own argv.

Deliberately free of heavy imports: `pgworkerd run` masks a `--dsn` password in its argv
(which every local user can read in `ps`) before psycopg and click load (~0.2 s).
"""

from __future__ import annotations

import re
import sys

_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_PASSWORD_KV = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_URL_PREFIX = re.compile(r"^\s*postgres(ql)?://", re.IGNORECASE)


def mask_password(text: str) -> str:
    """Replace any password in a DSN-like text (URL or key=value form) with ***."""
    if "=" not in text and "://" not in text:
        # Neither pattern can match (each needs one of these): most log lines, every
        # per-job event among them, skip both regular expressions.
        return text
    text = _PASSWORD_IN_URL.sub(r"\1***@", text)
    return _PASSWORD_KV.sub(r"\1***", text)


_KV_PASSWORD = re.compile(r"(?:^|\s)password\s*=\s*", re.IGNORECASE)
_NEXT_KEY = re.compile(r"\s+[A-Za-z_]+\s*=")


def dsn_secrets(dsn: str) -> list[str]:
    """The password-like parts of a DSN, found without parsing it (it may be one libpq
    cannot parse). In a URL: everything after the first ':' of the user-info, up to the
    last '@' (a malformed password may hold spaces, '%' or '@'), and any `password=`
    query value. In key=value form: a `password=` value up to the next `key=` (an
    unquoted password with a space in it is malformed, and libpq quotes its words one by
    one in its message), and each of its words of 4 characters or more."""
    m = _URL_PREFIX.match(dsn)
    found = []
    if m:
        rest = dsn[m.end() :]
        userinfo = rest.rpartition("@")[0]
        if ":" in userinfo:
            found.append(userinfo.partition(":")[2])
        for part in rest.partition("?")[2].split("&"):
            key, sep, value = part.partition("=")
            if sep and key.strip().lower() == "password":
                found.append(value)
    else:
        for kv in _KV_PASSWORD.finditer(dsn):
            tail = dsn[kv.end() :]
            if tail.startswith("'"):
                found.append(tail[1:].split("'", 1)[0])
                continue
            nxt = _NEXT_KEY.search(tail)
            value = tail[: nxt.start()] if nxt else tail
            found.append(value.strip())
            # its words, which libpq quotes one by one (short ones would match anywhere)
            found += [word for word in value.split() if len(word) >= 4]
    # longest first: a part of a secret is masked only where the whole is not
    return sorted({s for s in found if s}, key=len, reverse=True)


def mask_dsn(dsn: str) -> str:
    """A DSN with its password masked, even when it is malformed."""
    for secret in dsn_secrets(dsn):
        dsn = dsn.replace(secret, "***")
    return mask_password(dsn)


def mask_argv(argv: list[str] | None = None) -> bool:
    """Rewrite the process title without a `--dsn` password; True if it changed.

    The kernel shows a process's argv in /proc/PID/cmdline (`ps -ef`) to every local user.
    What the title held between exec and this call cannot be taken back: a DSN with a
    password belongs in the config file, PGWORKERD_DSN, PGPASSWORD or ~/.pgpass.
    """
    argv = list(sys.argv if argv is None else argv)
    masked = []
    after_dsn = False
    for arg in argv:
        if after_dsn:
            masked.append(mask_dsn(arg))
            after_dsn = False
        elif arg.startswith("--dsn="):
            masked.append("--dsn=" + mask_dsn(arg.removeprefix("--dsn=")))
        else:
            after_dsn = arg == "--dsn"
            masked.append(arg)
    if masked == argv:
        return False
    from setproctitle import setproctitle  # a small C extension: fast to load

    setproctitle(" ".join(masked))
    return True
