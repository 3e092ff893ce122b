"""The one error type users see.

The library raises :class:`DraftkitError` with a message that says what is wrong and what to
do; the CLI prints it as one line and exits non-zero, the server turns it into an HTTP 400.
Anything else that escapes is a bug in draftkit and keeps its traceback.

The CLI's exit statuses: 0 done; 2 bad input, or a bundle, recipe or flag refused
(:class:`DraftkitError`); 3 a valid "no" (:class:`Declined`: refresh found no faster draft,
traffic found drift, check found a bundle that fails a check); 1 anything unexpected.
"""

EXIT_OK, EXIT_REFUSED, EXIT_DECLINED = 0, 2, 3  # 1: Python's own, for a traceback


class DraftkitError(Exception):
    """A problem with the user's input or environment, with a message they can act on."""


class ConfigError(DraftkitError):
    """A recipe, override or flag that does not fit its dataclass."""


class ModelError(DraftkitError):
    """A model that cannot be found, downloaded, parsed or paired with another."""


class Declined(DraftkitError):
    """A command's valid answer "no", with why: the question was answered, the answer is not
    the one a script would go on with (exit status 3, not 2)."""
