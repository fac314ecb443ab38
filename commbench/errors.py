"""The exceptions that end a command with one line and no traceback.

UsageError means "the user asked for something impossible": said on every rank, exit
code 2, as argparse does for bad flags. NotRecorded means "measured, but its result
could not be written": said once, by the process that wrote, exit code 1 everywhere.
"""


class UsageError(Exception):
    exit_code = 2


class NotRecorded(Exception):
    """A measurement whose result file could not be written; its message names the file
    and why. Raised with an empty message on the ranks that did not write, which end
    with the same exit code without repeating rank 0's line."""

    exit_code = 1
