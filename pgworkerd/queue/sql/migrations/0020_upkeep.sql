-- Upkeep (issue 21): retry resets snoozes, retention of schedule runs and gone daemons.
-- compatible-with-code-of-schema: 5
--
-- Reserved in session 7 for issue 21 (retry and retention); filled in by its work stream. An empty
-- migration changes nothing.

SELECT 1;
