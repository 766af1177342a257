-- A daemon role that cannot touch other hosts' attempts, fire schedules at ticks of its choosing, or keep fake daemons alive (issue 22).
-- compatible-with-code-of-schema: 5
--
-- Reserved in session 8 for issue 22 (the daemon role's remaining rights); filled in by its work stream. An empty
-- migration changes nothing.

SELECT 1;
