# Each driver on its own: SQLite, PostgreSQL, plans, connections.
