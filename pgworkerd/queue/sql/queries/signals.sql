-- Signals (0028): what `pgworkerd signal`, pgworkerd.signal and the dashboard send and show.

-- name: signal_send
-- Signal %(name)s to job %(id)s with %(payload)s (signal_send in signals.sql): outcome
-- resumed, kept or ignored, the job's status after it, and when the (first) signal came.
SELECT %(id)s::bigint AS job_id, s.outcome, s.status, s.sent_at
  FROM @schema@.signal_send(%(id)s::bigint, %(name)s::text, %(payload)s::jsonb) AS s;

-- name: signal_send_by_key
-- Signal %(name)s to the live job whose wait holds correlation key %(key)s, or park it under
-- the key for the next job that waits with it (signal_send_by_key_v2, 0032).
SELECT s.job_id, s.outcome, s.status, s.sent_at
  FROM @schema@.signal_send_by_key_v2(%(key)s::text, %(name)s::text, %(payload)s::jsonb) AS s;

-- name: signal_list
-- The signals job %(id)s received, oldest first, at most %(limit)s (the newest; total: how
-- many in all), each payload as JSON text of at most %(shown)s characters (payload_chars:
-- its whole length; NULL: none): `show` and the dashboard's job page, bounded whatever a
-- sender wrote.
SELECT s.name, left(s.payload::text, %(shown)s) AS payload, length(s.payload::text) AS payload_chars,
       s.sent_at, s.sent_by, count(*) OVER () AS total
  FROM @schema@.signals s
 WHERE s.job_id = %(id)s::bigint
 ORDER BY s.sent_at DESC, s.name
 LIMIT %(limit)s;
