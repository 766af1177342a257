-- Pausing queues and handlers fleet-wide (0009): the table claim_v3 reads, and the
-- functions an operator pauses and resumes with.

-- Queues and handlers paused fleet-wide: claim_v3 claims none of their jobs (pending
-- ones stay pending; running ones finish normally). A few rows at most.
CREATE TABLE @schema@.paused (
    kind      text NOT NULL,
    name      text NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text NOT NULL DEFAULT session_user,
    comment   text,  -- why: the reason the operator gave (at most 500 characters)
    PRIMARY KEY (kind, name),
    CONSTRAINT paused_kind_known CHECK (kind IN ('queue', 'handler')),
    -- The person who asked (0038, paused_add): the dashboard's user, the CLI's --by or OS
    -- user; NULL for a pause through pause() (paused_by, the database role, says who).
    requested_by text
);

-- Pause and resume. Idempotent: pausing what is paused keeps its first pause (time, role
-- and comment) and returns false; resuming what is not paused returns false. A name is
-- checked like a queue or handler name at enqueue (anything else could never match a
-- job). Definer's rights: callers need EXECUTE only (deploy/roles.sql grants it to
-- pgworkerd_daemon, the operators' role); paused_by is the caller's session role.
CREATE FUNCTION @schema@.pause(kind text, name text, comment text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    added integer;
BEGIN
    IF kind IS NULL OR kind NOT IN ('queue', 'handler') THEN
        RAISE EXCEPTION 'pgworkerd: can pause a queue or a handler, not %',
            coalesce(quote_literal(kind), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF name IS NULL OR NOT @schema@.enqueue_name_ok(name) THEN
        RAISE EXCEPTION 'pgworkerd: % name must be a non-empty printable name of at most 128 '
            'characters', kind USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF char_length(comment) > 500 THEN
        RAISE EXCEPTION 'pgworkerd: comment must be at most 500 characters, not %',
            char_length(comment) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO @schema@.paused AS p (kind, name, comment)
    VALUES (pause.kind, pause.name, pause.comment)
    ON CONFLICT ON CONSTRAINT paused_pkey DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added > 0;
END;
$$;

CREATE FUNCTION @schema@.resume(kind text, name text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    removed integer;
BEGIN
    IF kind IS NULL OR kind NOT IN ('queue', 'handler') THEN
        RAISE EXCEPTION 'pgworkerd: can resume a queue or a handler, not %',
            coalesce(quote_literal(kind), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM @schema@.paused p WHERE p.kind = resume.kind AND p.name = resume.name;
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed > 0 THEN
        -- wake the daemons: their jobs are claimable again (the payload is not read)
        PERFORM pg_notify(@schema_literal@ || '.jobs', resume.name);
    END IF;
    RETURN removed > 0;
END;
$$;

CREATE FUNCTION @schema@.pause_queue(name text, comment text DEFAULT NULL)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @schema@.pause('queue', name, comment);

CREATE FUNCTION @schema@.resume_queue(name text)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @schema@.resume('queue', name);

CREATE FUNCTION @schema@.pause_handler(name text, comment text DEFAULT NULL)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @schema@.pause('handler', name, comment);

CREATE FUNCTION @schema@.resume_handler(name text)
RETURNS boolean LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
RETURN @schema@.resume('handler', name);

REVOKE EXECUTE ON FUNCTION @schema@.pause(text, text, text), @schema@.resume(text, text),
    @schema@.pause_queue(text, text), @schema@.resume_queue(text),
    @schema@.pause_handler(text, text), @schema@.resume_handler(text) FROM PUBLIC;

-- Pause with the person who asked (0038, issue 27): what pause() does, with the reason
-- (comment) and requested_by, the name of the person (the dashboard's user, the CLI's
-- --by or OS user), which paused_by (the database role, shared by every operator) cannot
-- tell. Both bounded and inert: the reason at most 500 characters, the name 1 to 128,
-- neither with control characters (22023 through fenced_refuse). Idempotent like pause():
-- a second pause keeps the first (its time, reason and person) and returns false.
CREATE FUNCTION @schema@.paused_add(kind text, name text, reason text, requested_by text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    added integer;
BEGIN
    IF kind IS NULL OR kind NOT IN ('queue', 'handler') THEN
        PERFORM @schema@.fenced_refuse('pausing', 'can pause a queue or a handler, not '
            || coalesce(quote_literal(kind), 'NULL'));
    ELSIF name IS NULL OR NOT @schema@.enqueue_name_ok(name) THEN
        PERFORM @schema@.fenced_refuse('pausing', kind
            || ' name must be a non-empty printable name of at most 128 characters');
    ELSIF char_length(reason) > 500 THEN
        PERFORM @schema@.fenced_refuse('pausing',
            format('the reason must be at most 500 characters, not %s', char_length(reason)));
    ELSIF reason ~ '[[:cntrl:]]' THEN
        PERFORM @schema@.fenced_refuse('pausing',
            'the reason must be one line without control characters');
    ELSIF requested_by IS NULL OR char_length(requested_by) NOT BETWEEN 1 AND 128
          OR requested_by ~ '[[:cntrl:]]' THEN
        PERFORM @schema@.fenced_refuse('pausing', 'who asked (requested_by) must be a name of'
            || ' 1 to 128 characters without control characters');
    END IF;
    INSERT INTO @schema@.paused AS p (kind, name, comment, requested_by)
    VALUES (paused_add.kind, paused_add.name, nullif(paused_add.reason, ''),
            paused_add.requested_by)
    ON CONFLICT ON CONSTRAINT paused_pkey DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added > 0;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.paused_add(text, text, text, text) FROM PUBLIC;
