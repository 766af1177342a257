-- Placeholder for stream fair_rest (session 11); replaced by the stream's migration.
-- compatible-with-code-of-schema: 5
SELECT 1;
