"""What others could do with the config file: the permission audit behind the warnings of
`run`, `check-config` and `web`."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

from pgworkerd.config.model import Config
from pgworkerd.masking import mask_dsn


def _holds_password(dsn: str) -> bool:
    return bool(dsn) and mask_dsn(dsn) != dsn


def file_warnings(config: Config) -> list[str]:
    """What others could do with the config file: read its password, or rewrite it (and
    with it the handlers' code, since a target is imported as written). Warnings, not
    errors: the operator decides, and a running daemon keeps running."""
    path = Path(config.path)
    try:
        st = path.stat()
    except OSError:
        return []
    found = []
    own_groups = {os.getgid(), os.getegid(), *os.getgroups()}
    if st.st_mode & stat.S_IROTH:
        readable = "others"
    elif st.st_mode & stat.S_IRGRP and st.st_gid not in own_groups:
        try:
            readable = f"group {grp.getgrgid(st.st_gid).gr_name}"
        except KeyError:
            readable = f"group {st.st_gid}"
    else:
        readable = ""
    if readable and (
        _holds_password(config.database.dsn) or _holds_password(config.database.listen_dsn)
    ):
        found.append(
            f"{path} holds a database password and is readable by {readable}: "
            f"chmod 600 {path} (or move the password to ~/.pgpass or PGPASSWORD)"
        )
    if readable and config.web.users:
        # a hash is slow to guess, not impossible: offline guessing needs no throttle
        found.append(
            f"{path} holds [web.users] password hashes and is readable by {readable}, who "
            f"can guess passwords offline: chmod 600 {path}"
        )
    if st.st_mode & stat.S_IWOTH:
        found.append(
            f"{path} is writable by others, who could change its handlers: chmod o-w {path}"
        )
    # The directory (of the link and of its target): there, others could replace the file.
    for directory in dict.fromkeys([path.absolute().parent, path.resolve().parent]):
        try:
            mode = directory.stat().st_mode
        except OSError:
            continue
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            found.append(
                f"{path} is in {directory}, which others can write (no sticky bit): they "
                f"could replace the file; keep it in a directory only its owner can write"
            )
    return found
