"""User-facing errors.

Anything the user can fix (a bad recipe field, a missing file, a mis-shaped tensor)
raises `UserError`. The CLI prints its message on one line and exits with code 2;
no traceback. Messages name the file and/or field, the offending value, and what
is allowed.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line with exit code 2."""

    exit_code = 2


class StopHere(Exception):
    """A stage runs on another machine; the message says which command to run where (the
    pipeline stops there with exit code 3, not an error)."""
