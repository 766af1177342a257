-- The other-language path (issue 21): one stable claim, durable finishing functions.
-- compatible-with-code-of-schema: 5
--
-- Reserved in session 7 for issue 21 (the other-language path); filled in by its work stream. An empty
-- migration changes nothing.

SELECT 1;
