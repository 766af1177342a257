-- Hand-back drains (issue 21): what a drain asks of the daemons it targets.
-- compatible-with-code-of-schema: 5
--
-- Reserved in session 7 for issue 21 (hand-back drain); filled in by its work stream. An empty
-- migration changes nothing.

SELECT 1;
