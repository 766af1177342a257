"""pgworkerd: runs long background jobs stored in PostgreSQL."""

from pgworkerd.jobs import JobSpec, enqueue, enqueue_many

__version__ = "0.1.0"
__all__ = ["JobSpec", "__version__", "enqueue", "enqueue_many"]
