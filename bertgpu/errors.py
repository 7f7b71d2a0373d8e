"""The one exception type a user's mistake becomes.

Anything raised as ``UserError`` is printed by the CLI as a single line
(``bertgpu: error: ...``) with a non-zero exit, never as a traceback.
"""

import importlib
from types import ModuleType


class UserError(Exception):
    """A mistake in the user's input: a missing file, a bad flag, mismatched data."""


def require(module: str, message: str) -> ModuleType:
    """Import an optional dependency, or raise ``message`` (one line saying what to install) as a UserError."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(message) from None
