"""Helpers to enqueue jobs inside a framework's own transaction, on its own connection:
pgworkerd.contrib.django (the psycopg 3 backend) and pgworkerd.contrib.sqlalchemy (the
psycopg dialect). Each imports its framework only when used (docs/guide/frameworks.md)."""
