-- Wake-ups aimed at daemons (issue 26, item 6): a batch of new jobs wakes the daemons
-- chosen for it on their own channels, not every daemon of the fleet.
-- compatible-with-code-of-schema: 5
--
-- An expand migration: a new column of the registry (workers.wake_channel, NULL for every
-- row until its daemon says it listens there) and new functions; notify_wake is replaced
-- (SECURITY DEFINER now: it reads the registry through workers_wake). Older daemons run on:
-- their rows have no channel, so a batch whose group holds one of them goes to the fleet's
-- channel as before, and they rank it as before. The declarations are objects/workers.sql
-- and objects/jobs.sql; this is the same text.

ALTER TABLE @schema@.workers ADD COLUMN wake_channel text
    CONSTRAINT workers_wake_channel_check CHECK (octet_length(wake_channel) <= 63);

-- Wake-ups aimed at daemons (0040).
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- The channel of a daemon's own wake-ups: short whatever the schema's name (a channel name
-- is at most 63 bytes) and distinct per schema and daemon. Channels are per database.
CREATE FUNCTION @schema@.worker_wake_channel_name(worker text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
RETURN 'pgworkerd.w.' || left(md5(@schema_literal@ || ':' || worker), 24);

-- LISTEN on the caller's own channel (a daemon's LISTEN connection, before it says so in
-- its row with worker_wake_channel_set); returns the channel. LISTEN needs no right: any
-- role may listen anywhere, as any may NOTIFY.
CREATE FUNCTION @schema@.worker_wake_listen(worker text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    channel text := @schema@.worker_wake_channel_name(worker);
BEGIN
    EXECUTE format('LISTEN %I', channel);
    RETURN channel;
END;
$$;

-- Whether the caller's own row says it listens on its channel (the secret names the row,
-- as every write of it); false when there is no such row (register first).
CREATE FUNCTION @schema@.worker_wake_channel_set(id text, secret text, listening boolean)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE @schema@.workers w
       SET wake_channel = CASE WHEN worker_wake_channel_set.listening
                               THEN @schema@.worker_wake_channel_name(w.id) END
     WHERE w.id = worker_wake_channel_set.id AND w.state <> 'gone'
       AND w.secret_sha256 = @schema@.worker_secret_digest(worker_wake_channel_set.secret);
    RETURN FOUND;
END;
$$;

-- Whose wake-up `n` new jobs of (queue, handler) are, the lowest of them `job_id`: a group
-- of the running daemons that serve both, are not draining and keep to their heartbeat
-- (not daemon_silent), ranked by the highest hash of each daemon's id seeded with the job
-- id (rendezvous hashing: an even share each; a daemon coming or going moves only its own
-- share), from the `skip`-th on, as many as hold the n jobs by their slots. Each is
-- notified on its own channel, so that one enqueue wakes one daemon process, not the
-- fleet (PostgreSQL 15 still signals every listening backend of the database, which reads
-- the notification and passes it over: see docs/operations/fleet.md). A group with a
-- daemon that has no channel (older, or not listening now), or no daemon at all for the
-- first group, and the notification also goes to the fleet's channel as before: every
-- daemon ranks it on its own ring (daemon/peers.py); a wake-up may be taken twice, never
-- dropped. A wake-up handed on past the last daemon goes nowhere: the last ones keep it.
-- The payload on a daemon's channel: {"q", "h", "id", "n", "skip", "next": where the next
-- group starts, "hops"}; on the fleet's: {"q", "h", "id", "n"} (with "skip" and "hops"
-- when handed on), as before 0040.
-- Called by the trigger of new jobs (notify_wake) and by daemons handing on a wake-up they
-- cannot take (skip = next, hops + 1). Returns the daemons notified on their own channel.
CREATE FUNCTION @schema@.workers_wake(queue text, handler text, job_id bigint, n bigint,
                                     skip integer, hops integer)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    daemon record;
    held bigint := 0;
    size integer := 0;
    channels text[] := '{}';
    fleet boolean := false;
    body text;
BEGIN
    IF queue IS NULL OR handler IS NULL OR job_id IS NULL OR n IS NULL OR n < 1
       OR skip IS NULL OR skip < 0 OR hops IS NULL OR hops < 0 THEN
        RAISE EXCEPTION 'pgworkerd: workers_wake needs a queue, a handler, a job id, n >= 1, '
                        'skip >= 0 and hops >= 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR daemon IN
        SELECT w.wake_channel, greatest(w.slots, 1) AS slots
          FROM @schema@.workers w
         WHERE w.state = 'running' AND NOT w.drain_requested
           AND NOT @schema@.daemon_silent(w)
           AND w.heartbeat_at <= now() + interval '5 seconds'
           AND workers_wake.queue = ANY (w.queues) AND workers_wake.handler = ANY (w.handlers)
         ORDER BY hashtextextended(w.id, workers_wake.job_id) DESC, w.id
        OFFSET skip
    LOOP
        EXIT WHEN held >= n;
        held := held + daemon.slots;
        size := size + 1;
        IF daemon.wake_channel IS NULL THEN
            fleet := true;
        ELSE
            channels := channels || daemon.wake_channel;
        END IF;
    END LOOP;
    body := json_build_object('q', queue, 'h', handler, 'id', job_id, 'n', n)::text;
    IF fleet OR (size = 0 AND skip = 0) THEN
        -- as the trigger sent it before 0040 (and a daemon's forward: with skip and hops)
        PERFORM pg_notify(@schema_literal@ || '.wake',
                          CASE WHEN skip = 0 AND hops = 0 THEN body
                          ELSE left(body, -1) || format(', "skip" : %s, "hops" : %s}', skip, hops)
                          END);
    END IF;
    body := left(body, -1) || format(', "skip" : %s, "next" : %s, "hops" : %s}',
                                     skip, skip + size, hops);
    PERFORM pg_notify(c, body) FROM unnest(channels) AS c;
    RETURN cardinality(channels);
END;
$$;

REVOKE EXECUTE ON FUNCTION
    @schema@.worker_wake_channel_set(text, text, boolean),
    @schema@.workers_wake(text, text, bigint, bigint, integer, integer)
    FROM PUBLIC;

CREATE OR REPLACE FUNCTION @schema@.notify_wake()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    batch record;
BEGIN
    FOR batch IN
        SELECT a.queue, a.handler, min(a.id) AS id, count(*) AS n
          FROM added a
         GROUP BY a.queue, a.handler
    LOOP
        IF octet_length(batch.queue) + octet_length(batch.handler) <= 2048 THEN
            PERFORM @schema@.workers_wake(batch.queue, batch.handler, batch.id, batch.n, 0, 0);
        ELSE
            PERFORM pg_notify(@schema_literal@ || '.wake',
                              json_build_object('id', batch.id, 'n', batch.n)::text);
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

