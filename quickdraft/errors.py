"""Errors a user can act on.

Every error raised on purpose by quickdraft is a `QuickdraftError` whose message is one line:
what was wrong and what to do about it. The CLI prints it without a traceback and exits with
`exit_code`; the server turns it into an OpenAI-shaped error body.
"""


class QuickdraftError(Exception):
    """A failure with a one-line, actionable message."""

    exit_code = 1


class UsageError(QuickdraftError):
    """The caller asked for something invalid (bad argument, unknown name, prompt too long)."""

    exit_code = 2


class ModelError(QuickdraftError):
    """A model could not be found, fetched, verified or loaded."""

    exit_code = 1


class InternalError(RuntimeError):
    """A broken invariant inside quickdraft (a rollback past the cache, a drafter missing target states): a bug,
    not the caller's mistake, so it is no `QuickdraftError` and is reported as an unexpected failure."""
