-- The daemon role does what a daemon does and no more (issue 22, N4 and N9).
-- compatible-with-code-of-schema: 5
--
-- Reserved in session 7 for issue 22 (the daemon role's rights); filled in by its work stream. An empty
-- migration changes nothing.

SELECT 1;
