"""Never write over what a command was given: the one check every command that writes makes first.

An output that is an input, contains one (a directory that ``--overwrite`` would empty) or lies inside one
(a file or run written into a model, data or corpus directory) is refused with one line before anything is
read, deleted or written, ``--overwrite`` or not. Paths are compared after ``realpath`` (so ``.``, ``..``,
symbolic links and another spelling of the same place are the same place), and an existing output that is
a hard link of an input counts as that input.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Mapping

from bertgpu.errors import UserError

# An input: one path, several (a corpus), or nothing (an optional flag left out).
Input = str | os.PathLike | Iterable[str | os.PathLike] | None


def real(path: str | os.PathLike) -> str:
    """The absolute path with every symbolic link, ``.`` and ``..`` resolved (also for paths that do not exist)."""
    return os.path.realpath(os.path.expanduser(str(path)))


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip(os.sep) + os.sep)


def _expand(value: Input) -> list[str]:
    """The paths of an input as given: a glob also stands for what it matches."""
    if value is None or value == "":
        return []
    items = [value] if isinstance(value, str | os.PathLike) else list(value)
    found: list[str] = []
    for item in items:
        text = os.path.expanduser(str(item))
        if not text:
            continue
        found.append(text)
        if not os.path.exists(text) and glob.has_magic(text):
            found += glob.glob(text, recursive=True)
    return found


def refuse_clobbering(outputs: Mapping[str, str | os.PathLike | None], inputs: Mapping[str, Input]) -> None:
    """A one-line UserError when an output (flag -> path) is, contains or lies inside an input (label ->
    path(s)); labels name what the user gave (``--model``, ``--data``, ``the corpus``).
    Call it before anything is deleted or written."""
    for out_flag, out in outputs.items():
        if out is None or str(out) == "":
            continue
        out_real = real(out)
        for in_label, value in inputs.items():
            for given in _expand(value):
                in_real = real(given)
                if out_real == in_real or _same_file(out, given):
                    how = "is"
                elif _inside(in_real, out_real):
                    how = "contains"
                elif _inside(out_real, in_real):
                    how = "lies inside"
                else:
                    continue
                raise UserError(
                    f"{out_flag} {out} {how} {in_label} {given}: writing it would destroy what the command reads "
                    f"(nothing was written or deleted, --overwrite or not); choose another {out_flag}"
                )


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_existing(flag: str, path: str | os.PathLike | None, overwrite: bool) -> None:
    """An output file that exists is replaced only with ``--overwrite``, as every command treats its outputs
    (``vocab`` and ``prepare`` as ``predict`` and ``evaluate``); a directory is no file to write. Call it before
    the work, with ``refuse_clobbering``."""
    if path is None or str(path) == "":
        return
    if os.path.isdir(path):
        raise UserError(f"{flag} {path} is a directory: give the file to write")
    if os.path.lexists(path) and not overwrite:
        raise UserError(f"{flag} {path} already exists; pass --overwrite to replace it")
