"""The one exception type a user's mistake becomes.

Anything raised as ``UserError`` is printed by the CLI as a single line
(``bertgpu: error: ...``) with a non-zero exit, never as a traceback.
"""


class UserError(Exception):
    """A mistake in the user's input: a missing file, a bad flag, mismatched data."""
