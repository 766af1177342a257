"""The queue's vocabulary, free of dependencies: job statuses and the defaults of a job.

Imported by the client, the admin statements, the CLI and the metrics endpoint; it must
stay importable without psycopg (ops/metrics.py builds its gauges from STATUSES)."""

from __future__ import annotations

STATUSES = ("pending", "running", "completed", "dead", "cancelled")
FINAL_STATUSES = ("completed", "dead", "cancelled")
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_QUEUE = "default"
