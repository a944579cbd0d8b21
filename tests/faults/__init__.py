# The fault matrix (issue 32): real `jobs-trio worker` processes under faults on SQLite and
# PostgreSQL, one row a cell. Run it with `nox -s faults` or `python -m tests.faults.matrix`.
