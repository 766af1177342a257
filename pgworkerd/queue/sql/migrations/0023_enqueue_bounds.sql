-- Bounds an operator sets on what enqueuers may ask (issue 22, N11).
-- compatible-with-code-of-schema: 5
--
-- Reserved in session 7 for issue 22 (the enqueuer's bounds); filled in by its work stream. An empty
-- migration changes nothing.

SELECT 1;
