-- One text per fenced transition, for the daemon and other languages alike (issue 23).
-- compatible-with-code-of-schema: 5
--
-- Reserved in session 8 for issue 23 (fenced transitions); filled in by its work stream. An empty
-- migration changes nothing.

SELECT 1;
