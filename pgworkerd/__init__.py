"""pgworkerd: runs long background jobs stored in PostgreSQL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgworkerd.client import InvalidJob, JobSpec, enqueue, enqueue_many

__version__ = "0.3.0.dev0"
__all__ = ["InvalidJob", "JobSpec", "__version__", "enqueue", "enqueue_many"]


def __getattr__(name: str) -> Any:
    # Loaded on first use, not with the package: `pgworkerd run` must mask a password in
    # its argv before psycopg's ~0.2 s import (pgworkerd.masking).
    if name in ("InvalidJob", "JobSpec", "enqueue", "enqueue_many"):
        from pgworkerd import client

        return getattr(client, name)
    raise AttributeError(f"module 'pgworkerd' has no attribute {name!r}")
