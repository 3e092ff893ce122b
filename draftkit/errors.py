"""The one error type users see.

The library raises :class:`DraftkitError` with a message that says what is wrong and what to
do; the CLI prints it as one line and exits non-zero, the server turns it into an HTTP 400.
Anything else that escapes is a bug in draftkit and keeps its traceback.

The CLI's exit statuses are the ``EXIT_*`` constants below, each with what it means; the docs
site's reference lists them from here.
"""

EXIT_OK = 0  # done
EXIT_FAILED = 1  # an unexpected failure, with its traceback (Python's own status for one)
# bad input, or a bundle, recipe or flag refused (DraftkitError): one line saying what to do
EXIT_REFUSED = 2
# a valid "no" (Declined): refresh found no faster draft, traffic found drift, check found a
# bundle that fails a check
EXIT_DECLINED = 3
EXIT_INTERRUPTED = 130  # interrupted (Ctrl-C), as a shell reports SIGINT


class DraftkitError(Exception):
    """A problem with the user's input or environment, with a message they can act on."""


class ConfigError(DraftkitError):
    """A recipe, override or flag that does not fit its dataclass."""


class ModelError(DraftkitError):
    """A model that cannot be found, downloaded, parsed or paired with another."""


class Declined(DraftkitError):
    """A command's valid answer "no", with why: the question was answered, the answer is not
    the one a script would go on with (exit status 3, not 2)."""
