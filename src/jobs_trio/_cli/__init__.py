# The operators' command line: the console script, the commands, the demo. Apart because
# nothing of the library depends on it.
