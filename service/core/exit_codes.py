"""The exit codes of the `gdn-sweep` commands, one owner for each."""

EXIT_OK = 0
EXIT_TRIALS_FAILED = 1
"""A sweep ran and some trial did not succeed (also: a database that cannot be reached)."""
EXIT_NO_DATABASE = 1
"""The database cannot be reached, or a read command's SQLite file does not exist (nothing was
created): service/cli/database.py."""
EXIT_BAD_INPUT = 2
"""The command was refused before it did anything: a bad option, file or URL."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT)."""
