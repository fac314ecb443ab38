"""The one exception type that means "the user asked for something impossible".

It is printed as a single line (no traceback) and ends the process with exit
code 2 on every rank, as argparse does for bad flags.
"""


class UsageError(Exception):
    exit_code = 2
