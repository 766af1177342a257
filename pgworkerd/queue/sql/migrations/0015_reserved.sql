-- Placeholder on branch insight only: the number is taken by another helper's
-- migration; the merge drops this file (and its line in schema.sql).
-- compatible-with-code-of-schema: 5
SELECT 1;
