-- Roles for people (issue 21): what operators, dashboards and enqueuers may read and do.
-- compatible-with-code-of-schema: 5
--
-- Reserved in session 7 for issue 21 (roles for people); filled in by its work stream. An empty
-- migration changes nothing.

SELECT 1;
