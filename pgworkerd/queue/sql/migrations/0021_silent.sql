-- Silent daemons (issue 21): each daemon records the heartbeat interval it keeps, so that
-- a running job whose daemon stopped heartbeating is flagged long before its lease ends.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): a column with a constant default (no table
-- rewrite) and a new function; older daemons run on and leave the default, the longest
-- gap between their heartbeats (HEARTBEAT_IDLE, 10 s), so they are never flagged early.

-- The longest a daemon lets pass between two registry heartbeats, as it promised at its
-- latest one: 5 s while it holds running jobs, 10 s while idle (daemon/presence.py).
-- Bounded: an interval of a day would hide a dead daemon for two, one of 0 flag a live one.
ALTER TABLE @schema@.workers
    ADD COLUMN heartbeat_interval interval NOT NULL DEFAULT '10 seconds'
    CONSTRAINT workers_heartbeat_interval_check
    CHECK (heartbeat_interval >= interval '1 second' AND heartbeat_interval <= interval '1 hour');

-- The one definition of a silent daemon, used by `explain`, `status`, `show`, the
-- dashboard and the metric: its registry heartbeat is older than twice the interval it
-- promised (one heartbeat missed, and as long again for a loaded host or database).
-- Killed, frozen, or cut off from the database: nobody can tell which from here, so
-- nothing acts on it (a cut-off host's child runs on until its lease ends).
-- A SQL-standard body that PostgreSQL inlines into the calling statement (a function
-- with SET search_path is called row by row: 19 ms for 1,000 registry rows), its names
-- bound now, as the pinned search_path of the other functions would bind them.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
CREATE FUNCTION @schema@.daemon_silent(w @schema@.workers)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
RETURN w.heartbeat_at < now() - 2 * w.heartbeat_interval;
