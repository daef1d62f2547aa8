"""The one exception type users see: a clear, one-line message about bad input."""


class QuickdraftError(ValueError):
    """Bad input or an incompatible configuration (CLI: exit 2 with this message)."""


class ContextLengthError(QuickdraftError):
    """A prompt (plus its token budget) that cannot fit the model's context (server: code
    context_length_exceeded)."""
