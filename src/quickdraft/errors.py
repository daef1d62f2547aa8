"""The one exception type users see: a clear, one-line message about bad input."""


class QuickdraftError(ValueError):
    """Bad input or an incompatible configuration (CLI: exit 2 with this message)."""
