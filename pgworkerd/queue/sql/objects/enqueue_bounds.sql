-- Enqueue bounds (0023): what an operator allows enqueuers.

-- What an operator allows enqueuers: a priority range and namespaces for their keys, per
-- login role (or a role it is a member of) and per queue. Without a row an enqueuer
-- chooses any priority (-32768 is claimed before everything else due) and any dedupe or
-- concurrency key of any handler it names (README "Trust boundaries"). A row binds the
-- logins it names:
--   role_name  a role: that login, and every login that is a member of it (a superuser
--              only when named itself); NULL: every login;
--   queue      the jobs of that queue only; NULL: of every queue;
--   priority_min .. priority_max: the priorities those jobs may have (the default 0
--              included: a range that leaves out 0 refuses jobs that name no priority);
--   dedupe_key_prefix, concurrency_key_prefix: every such key of those jobs starts with
--              it; NULL: any key.
-- Every row that binds a job holds (several rows: the narrowest of each). The enqueue
-- functions check them (enqueue_bounds_check) before writing anything; deploy/roles.sql
-- lets pgworkerd_operator write the rows and pgworkerd_reader read them. The checks
-- refuse a row that could not work: an inverted or out-of-range priority range, an empty,
-- over-long or unprintable prefix, a queue name no job can have, a role that does not
-- exist (so a typo does not leave an application unbounded).
CREATE TABLE @schema@.enqueue_bounds (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    role_name              text,
    queue                  text,
    priority_min           integer NOT NULL DEFAULT -32768,
    priority_max           integer NOT NULL DEFAULT 32767,
    dedupe_key_prefix      text,
    concurrency_key_prefix text,
    comment                text,
    set_by                 text NOT NULL DEFAULT session_user,
    set_at                 timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT enqueue_bounds_role_exists
        CHECK (role_name IS NULL OR pg_catalog.to_regrole(pg_catalog.quote_ident(role_name))
                                    IS NOT NULL),
    CONSTRAINT enqueue_bounds_queue_name CHECK (@schema@.enqueue_name_ok(queue)),
    CONSTRAINT enqueue_bounds_priority_range
        CHECK (priority_min BETWEEN -32768 AND 32767 AND priority_max BETWEEN -32768 AND 32767
               AND priority_min <= priority_max),
    CONSTRAINT enqueue_bounds_dedupe_key_prefix
        CHECK (char_length(dedupe_key_prefix) BETWEEN 1 AND 64
               AND dedupe_key_prefix !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]'),
    CONSTRAINT enqueue_bounds_concurrency_key_prefix
        CHECK (char_length(concurrency_key_prefix) BETWEEN 1 AND 64
               AND concurrency_key_prefix
                   !~ '[\x01-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]'),
    CONSTRAINT enqueue_bounds_comment CHECK (char_length(comment) <= 500)
);

-- One row per (role, queue), NULL for "every": an operator replaces a bound, never stacks
-- a second one by mistake.
CREATE UNIQUE INDEX enqueue_bounds_role_queue_idx
    ON @schema@.enqueue_bounds (coalesce(role_name, ''), coalesce(queue, ''));

-- Raises for the first job of `jobs` (enqueue_many's array, before its own checks) that
-- a bound on this login refuses (42501, naming the bound and what it allows); returns
-- when none does. The login is session_user (the enqueue functions are SECURITY DEFINER:
-- current_user is the owner; SET ROLE changes neither). Called by enqueue, enqueue_many
-- and enqueue_many_v2 (so enqueue_v2 and schedule_fire) only when the table has a row:
-- one statement reads the bounds that bind this login once and checks every job against
-- them. Values of the wrong type are left to the checks that follow.
CREATE FUNCTION @schema@.enqueue_bounds_check(jobs jsonb)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    broken record;
    scope text;
BEGIN
    -- One statement: the bounds that bind this login, read once (MATERIALIZED), then
    -- every job against them.
    WITH binding AS MATERIALIZED (
        SELECT b.* FROM @schema@.enqueue_bounds b
         WHERE b.role_name IS NULL
            OR b.role_name = session_user
            OR EXISTS (SELECT FROM pg_roles r
                        WHERE r.rolname = b.role_name
                          AND pg_has_role(session_user, r.oid, 'MEMBER')
                          -- a superuser "is a member" of every role: bound only when named
                          AND NOT (SELECT s.rolsuper FROM pg_roles s
                                    WHERE s.rolname = session_user))
    )
    SELECT t.n, v.priority, b.*,
           v.priority NOT BETWEEN b.priority_min AND b.priority_max AS bad_priority,
           NOT starts_with(v.dedupe_key, b.dedupe_key_prefix) AS bad_dedupe_key
      INTO broken
      FROM jsonb_array_elements(jobs) WITH ORDINALITY AS t(e, n)
     CROSS JOIN LATERAL (
         SELECT CASE WHEN jsonb_typeof(t.e->'queue') = 'string' THEN t.e->>'queue'
                     ELSE 'default' END AS queue,
                CASE WHEN jsonb_typeof(t.e->'priority') = 'number'
                     THEN (t.e->>'priority')::numeric ELSE 0 END AS priority,
                CASE WHEN jsonb_typeof(t.e->'dedupe_key') = 'string'
                     THEN t.e->>'dedupe_key' END AS dedupe_key,
                CASE WHEN jsonb_typeof(t.e->'concurrency_key') = 'string'
                     THEN t.e->>'concurrency_key' END AS concurrency_key) v
      JOIN binding b ON b.queue IS NULL OR b.queue = v.queue
     WHERE v.priority NOT BETWEEN b.priority_min AND b.priority_max
        OR NOT starts_with(v.dedupe_key, b.dedupe_key_prefix)
        OR NOT starts_with(v.concurrency_key, b.concurrency_key_prefix)
     ORDER BY t.n, b.id
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    scope := format('enqueue bound %s (%s, %s)', broken.id,
                    CASE WHEN broken.role_name IS NULL THEN 'every login'
                         ELSE 'role ' || quote_ident(broken.role_name) END,
                    CASE WHEN broken.queue IS NULL THEN 'every queue'
                         ELSE 'queue ' || quote_literal(broken.queue) END);
    -- the keys themselves are not repeated: a dedupe key may hold any character
    RAISE EXCEPTION 'pgworkerd: job % of %: %', broken.n, jsonb_array_length(jobs),
        CASE WHEN broken.bad_priority
             THEN format('priority %s is outside %s..%s, the priorities %s allows',
                         broken.priority, broken.priority_min, broken.priority_max, scope)
             WHEN broken.bad_dedupe_key
             THEN format('dedupe_key must start with %L (%s)', broken.dedupe_key_prefix, scope)
             ELSE format('concurrency_key must start with %L (%s)',
                         broken.concurrency_key_prefix, scope) END
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'An operator sets enqueue bounds in the enqueue_bounds table '
                     '(README "Trust boundaries").';
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.enqueue_bounds_check(jsonb) FROM PUBLIC;
