"""The one error type users see.

The library raises :class:`DraftkitError` with a message that says what is wrong and what to
do; the CLI prints it as one line and exits non-zero, the server turns it into an HTTP 400.
Anything else that escapes is a bug in draftkit and keeps its traceback.
"""


class DraftkitError(Exception):
    """A problem with the user's input or environment, with a message they can act on."""


class ConfigError(DraftkitError):
    """A recipe, override or flag that does not fit its dataclass."""


class ModelError(DraftkitError):
    """A model that cannot be found, downloaded, parsed or paired with another."""
