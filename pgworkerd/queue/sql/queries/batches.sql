-- Batches (schema 30, objects/batches.sql; docs/guide/batches.md).

-- name: batch_enqueue
-- Enqueue a batch: %(jobs)s (a JSON array of member job objects) and %(then)s (the
-- callback's job object), in one transaction; the batch's id, the callback's id and the
-- members' ids in input order.
SELECT batch_id, callback_id, member_ids
  FROM @schema@.batch_enqueue(%(jobs)s::jsonb, %(then)s::jsonb);

-- name: batch_members_page
-- Up to %(max_members)s members of batch %(batch_id)s after member id %(after_id)s (0: from
-- the first), in id order: for the login that enqueued its callback. The columns are named
-- as MemberOutcome's fields (pgworkerd/batches.py; test_column_contract.py).
SELECT id, status, result, last_error AS error
  FROM @schema@.batch_members_page(%(batch_id)s, %(after_id)s, %(max_members)s);

-- name: batch_of_job
-- The batch a job belongs to (as a member or as its callback), with its counts: show,
-- explain and the dashboard. No row: the job is in no batch.
SELECT b.id, b.callback_id, b.members, b.completed, b.dead, b.cancelled, b.created_at,
       b.released_at
  FROM @schema@.batches b
 WHERE b.callback_id = %(job_id)s
    OR b.id = (SELECT j.batch_id FROM @schema@.jobs j WHERE j.id = %(job_id)s);

-- name: batch_get
-- Batch %(batch_id)s with its counts (`pgworkerd batch ID`); no row: no such batch.
SELECT b.id, b.callback_id, b.members, b.completed, b.dead, b.cancelled, b.created_at,
       b.released_at, c.status::text AS callback_status, c.handler AS callback_handler
  FROM @schema@.batches b
  LEFT JOIN @schema@.jobs c ON c.id = b.callback_id
 WHERE b.id = %(batch_id)s;
