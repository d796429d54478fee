"""The one exception type the CLI turns into a one-line message (no traceback)."""


class BmoeError(Exception):
    """A problem the user can fix: bad input, an impossible option, a missing file."""
