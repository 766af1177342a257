"""The queue's vocabulary, free of dependencies: job statuses and the defaults of a job.

Imported by the client, the admin statements, the CLI and the metrics endpoint; it must
stay importable without psycopg (ops/metrics.py builds its gauges from STATUSES)."""

from __future__ import annotations

# In the enum's order (sql/objects/jobs.sql): waiting = for parents, suspended = for a
# signal or its timeout (issue 24).
STATUSES = ("pending", "waiting", "suspended", "running", "completed", "dead", "cancelled")
FINAL_STATUSES = ("completed", "dead", "cancelled")
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_QUEUE = "default"
