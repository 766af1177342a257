-- The operations console's bulk actions (issue 27): job_priority_set, the operator's way
-- to change the priority of a selection of jobs (its column grants do not cover priority).
-- compatible-with-code-of-schema: 5
--
-- An expand migration: one new function, granted to pgworkerd_operator by roles.sql;
-- nothing existing changes, so older code runs on. The declaration is
-- objects/job_actions.sql; this is the same text.

-- The operator's changes to a selection of jobs that its column grants do not cover
-- (0036, issue 27: the dashboard's bulk actions). A selection is at most 1000 jobs (the
-- dashboard's cap per action, held here too, so no caller can lock a million rows in one
-- statement); every argument is checked (22023 through fenced_refuse).

-- Set the priority of pending, waiting and suspended jobs (a running or finished job's
-- priority no longer matters: it says so). One row per id asked: 'priority set', 'is
-- <status>' or 'not found'.
CREATE FUNCTION @schema@.job_priority_set(ids bigint[], priority integer)
RETURNS TABLE (id bigint, outcome text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF ids IS NULL OR cardinality(ids) = 0 THEN
        PERFORM @schema@.fenced_refuse('setting priorities', 'no job ids given');
    ELSIF cardinality(ids) > 1000 THEN
        PERFORM @schema@.fenced_refuse('setting priorities',
            format('at most 1000 jobs at once, not %s', cardinality(ids)));
    ELSIF array_position(ids, NULL) IS NOT NULL THEN
        PERFORM @schema@.fenced_refuse('setting priorities', 'a job id is NULL');
    ELSIF job_priority_set.priority IS NULL
          OR job_priority_set.priority NOT BETWEEN -32768 AND 32767 THEN
        PERFORM @schema@.fenced_refuse('setting priorities',
            format('the priority must be an integer from -32768 to 32767, not %s',
                   coalesce(job_priority_set.priority::text, 'NULL')));
    END IF;
    RETURN QUERY
    WITH asked AS (
        SELECT DISTINCT a.id FROM unnest(ids) AS a(id)
    ), changed AS (
        UPDATE @schema@.jobs j
           SET priority = job_priority_set.priority, updated_at = now()
          FROM asked a
         WHERE j.id = a.id AND j.status IN ('pending', 'waiting', 'suspended')
        RETURNING j.id
    )
    SELECT a.id,
           CASE WHEN c.id IS NOT NULL THEN 'priority set'
                WHEN j.id IS NULL THEN 'not found'
                ELSE 'is ' || j.status::text END
      FROM asked a
      LEFT JOIN changed c ON c.id = a.id
      LEFT JOIN @schema@.jobs j ON j.id = a.id
     ORDER BY a.id;
END;
$$;

REVOKE EXECUTE ON FUNCTION @schema@.job_priority_set(bigint[], integer) FROM PUBLIC;
