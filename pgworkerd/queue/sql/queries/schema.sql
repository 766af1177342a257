-- Statements of the schema's own upkeep: `pgworkerd migrate` (queue/migrate.py) and its
-- version table.
--
-- Each statement under a "-- name:" header with a one-line description; queue/queries.py
-- loads every file of this folder into one registry (a name is defined once, in the file
-- of its entity: docs/development/sql.md). @schema@ is replaced by the quoted schema
-- name, @schema_literal@ by it as a string literal and @notify_channel@ (and the other
-- @..._channel@) by the quoted name of a channel; parameters are psycopg's %(name)s
-- placeholders (so a literal percent sign is written %%).

-- name: schema_migrate_lock
-- Serialise migrations of one schema across hosts, until the transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: schema_version_table_exists
-- Whether the schema and its version table exist (false before the first migration).
SELECT to_regclass(quote_ident(@schema_literal@) || '.schema_version') IS NOT NULL AS present;

-- name: schema_version_get
-- The highest applied migration, 0 when the version table is empty.
SELECT coalesce(max(version), 0) AS version FROM @schema@.schema_version;

-- name: schema_create
-- The schema itself, before the first migration.
CREATE SCHEMA IF NOT EXISTS @schema@;

-- name: schema_search_path_pin_local
-- For the rest of the transaction, resolve names in pg_catalog only: a fresh install's
-- declared objects bind their names as the functions' pinned search_path would.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- name: schema_version_create
-- The table of applied migrations, before the first migration.
CREATE TABLE @schema@.schema_version (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());

-- name: schema_version_insert
-- Record one applied migration.
INSERT INTO @schema@.schema_version (version, name) VALUES (%(version)s, %(name)s);

-- name: schema_version_add_compatibility
-- Version tables created before 0.2.0 lack compatible_with (NULL there means the version's
-- own number: only code that knows that version runs against it).
ALTER TABLE @schema@.schema_version ADD COLUMN IF NOT EXISTS compatible_with integer;

-- name: schema_version_set_compatibility
-- Record which older code still runs against the schema once migration %(version)s is in.
UPDATE @schema@.schema_version SET compatible_with = %(compatible_with)s
 WHERE version = %(version)s;

-- name: schema_version_oldest_compatible_code
-- The oldest code (by the latest schema version it knows) that runs against this schema:
-- the highest compatible_with of every applied migration. Read through to_jsonb so that a
-- version table without the column (before 0.2.0) reads as every migration's own number.
SELECT max(coalesce((to_jsonb(v)->>'compatible_with')::integer, v.version))
  FROM @schema@.schema_version v;
