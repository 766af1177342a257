"""The queue core: every SQL statement (sql/) and the typed wrappers that run them."""
