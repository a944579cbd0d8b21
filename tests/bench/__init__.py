# The bench/ scripts, each run small: they keep working as the code changes.
