"""Files and directories that appear whole or not at all.

Everything bertgpu writes for a user to keep (checkpoints, prepared data, vocab.txt, metrics,
predictions, the log) goes through here: it is built under a hidden temporary name beside its final
place, flushed to disk with fsync, then renamed in one step, and the parent directory is fsynced so
that the rename itself survives a power cut. A crash at any point leaves the previous version or
nothing: never half a file that a resume or a user would trust.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertgpu.errors import UserError


def fsync(path: str | os.PathLike) -> None:
    """Flush a file or a directory (its entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically. A path that cannot be written is a UserError naming it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"could not write {path} ({e.strerror or e})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` as UTF-8 with ``\\n`` line ends, atomically."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2, sort_keys: bool = False) -> Path:
    """Write ``obj`` as JSON (UTF-8, non-ASCII kept as is), atomically: the one way bertgpu writes JSON."""
    return write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, sort_keys=sort_keys) + "\n")


def new_temporary(final: str | os.PathLike) -> Path:
    """A new, empty, hidden sibling of ``final`` to build it in (``.NAME.tmp-*``: never taken as complete)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


def commit(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Make the complete directory ``tmp`` into ``final``: every file fsynced, then renamed, the
    previous ``final`` (if any) moved aside first and removed last."""
    tmp, final = Path(tmp), Path(final)
    parent = final.parent
    for root, _dirs, files in os.walk(tmp):
        for name in files:
            fsync(Path(root, name))
        fsync(root)
    if final.exists():
        old = parent / f".{final.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(final, old)
        try:
            os.rename(tmp, final)
        except BaseException:
            os.rename(old, final)
            raise
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    fsync(parent)


@contextlib.contextmanager
def directory(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory that becomes ``final`` only if the block succeeds.

    A crash or exception at any point leaves ``final`` either absent or holding its previous
    complete contents.
    """
    tmp = new_temporary(final)
    try:
        yield tmp
        commit(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
