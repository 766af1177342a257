-- Targeted wake-ups (issue 14): a notification per new batch of jobs that names them.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): one new function and one new trigger; no
-- existing function, table or signature changes. enqueue's own NOTIFY on '<schema>.jobs'
-- (the queue as payload) stays: release 0.2 daemons and the code of schemas 5 to 12
-- listen there and wake on every enqueue as before. Daemons of this schema listen on
-- '<schema>.wake' instead, where each notification says which jobs arrived, so that only
-- one daemon (chosen by rendezvous hashing of the job id over the live daemons serving
-- the queue and handler, see pgworkerd/daemon/peers.py) claims them.

-- After every statement that inserted jobs (enqueue, enqueue_many, their _v2 versions,
-- schedule_fire, a direct INSERT by whatever role): NOTIFY '<schema>.wake' once per queue
-- and handler inserted, the payload a JSON object {"q": queue, "h": handler, "id": the
-- lowest new id, "n": how many}, sent on commit. A statement trigger, so a bulk enqueue
-- of 10,000 jobs of one handler sends one notification, not 10,000. Names longer than
-- enqueue allows (a direct INSERT) are left out of the payload rather than failing the
-- insert on NOTIFY's 8,000-byte limit: daemons treat a payload without names as a wake-up
-- for every handler.
CREATE FUNCTION @schema@.notify_wake()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify(@schema_literal@ || '.wake',
                      CASE WHEN octet_length(a.queue) + octet_length(a.handler) <= 2048
                      THEN json_build_object('q', a.queue, 'h', a.handler,
                                             'id', min(a.id), 'n', count(*))
                      ELSE json_build_object('id', min(a.id), 'n', count(*)) END::text)
       FROM added a
      GROUP BY a.queue, a.handler;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_wake
    AFTER INSERT ON @schema@.jobs
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT
    EXECUTE FUNCTION @schema@.notify_wake();
