"""The one exception type a user's mistake becomes.

Anything raised as ``UserError`` is printed by the CLI as a single line
(``bertgpu: error: ...``) with a non-zero exit, never as a traceback.
"""

import difflib
import importlib
from collections.abc import Iterable
from types import ModuleType


class UserError(Exception):
    """A mistake in the user's input: a missing file, a bad flag, mismatched data."""


def require(module: str, message: str) -> ModuleType:
    """Import an optional dependency, or raise ``message`` (one line saying what to install) as a UserError."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(message) from None


def nearest(word: str, candidates: Iterable[str]) -> list[str]:
    """The candidates ``word`` likely meant: those it begins (an abbreviation), else difflib's closest, else the
    longest it begins with (a word run on: `--recipe fastest`, `--outdir`)."""
    candidates = list(candidates)
    starts = [c for c in candidates if c.startswith(word) and c != word]
    close = starts[:3] or difflib.get_close_matches(word, candidates, n=1, cutoff=0.75)
    within = sorted((c for c in candidates if word.startswith(c) and len(c) >= 3 and c != word), key=len)
    return close or within[-1:]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` for a typo of one of ``candidates``; '' when none is near."""
    close = nearest(word, candidates)
    return f" (did you mean {' or '.join(close)}?)" if close else ""
