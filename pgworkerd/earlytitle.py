"""Imported first by pgworkerd.cli, for its side effect: a `--dsn` password leaves the
process title before the slow imports (psycopg, click) run. See pgworkerd.masking."""

from pgworkerd.masking import mask_argv

mask_argv()
