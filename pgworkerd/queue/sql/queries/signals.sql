-- Signals (0028): what `pgworkerd signal`, pgworkerd.signal and the dashboard send and show.

-- name: signal_send
-- Signal %(name)s to job %(id)s with %(payload)s (signal_send in signals.sql): outcome
-- resumed, kept or ignored, the job's status after it, and when the (first) signal came.
SELECT %(id)s::bigint AS job_id, s.outcome, s.status, s.sent_at
  FROM @schema@.signal_send(%(id)s::bigint, %(name)s::text, %(payload)s::jsonb) AS s;

-- name: signal_send_by_key
-- Signal %(name)s to the live job whose wait holds correlation key %(key)s.
SELECT s.job_id, s.outcome, s.status, s.sent_at
  FROM @schema@.signal_send_by_key(%(key)s::text, %(name)s::text, %(payload)s::jsonb) AS s;

-- name: signal_list
-- The signals job %(id)s received, oldest first (`show`, the dashboard's job page).
SELECT s.name, s.payload, s.sent_at, s.sent_by
  FROM @schema@.signals s
 WHERE s.job_id = %(id)s::bigint
 ORDER BY s.sent_at, s.name;
