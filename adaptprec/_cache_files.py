"""The program cache's files: authenticated entries in a trusted directory.

Every operation opens the cache directory once, checks it and works relative to its
descriptor (:mod:`adaptprec._cache_trust`: what is checked, and what happens when a
check fails). A read returns an entry's body only when the file is yours, not writable by
others, and its HMAC tag is right; otherwise the file is deleted and the read raises
:class:`Refused` (its program is compiled again). Writes go to a new temporary file
(mode 0600) renamed over the entry, so readers never see half a file.

Size: at most :func:`adaptprec._cache_keys.max_bytes` (default 256 MB,
``$ADAPTPREC_CACHE_MAX_MB``); when a write goes over, the least recently used entries
(by modification time; a read touches its file) are deleted down to 3/4 of it. Only the
cache's own files (``<hash>.xla`` and ``.tmp-*``) are ever counted or deleted.

Example:
    >>> import os, tempfile
    >>> from adaptprec import _cache_files as files
    >>> saved = os.environ.get("ADAPTPREC_CACHE_DIR")
    >>> os.environ["ADAPTPREC_CACHE_DIR"] = d = tempfile.mkdtemp()
    >>> name = 40 * "a" + ".xla"
    >>> files.write(d, name, b"a pickle")
    True
    >>> bytes(files.read(d, name)), files.disk_info()["entries"]
    (b'a pickle', 1)
    >>> with open(os.path.join(d, name), "r+b") as fh:   # one byte changed
    ...     _ = fh.seek(-1, 2); _ = fh.write(b"!")
    >>> try:
    ...     files.read(d, name)
    ... except files.Refused as exc:
    ...     print(exc)
    its authentication tag is wrong or missing
    >>> files.disk_info()["entries"]   # (deleted)
    0
    >>> _ = (os.environ.pop("ADAPTPREC_CACHE_DIR") if saved is None
    ...      else os.environ.update(ADAPTPREC_CACHE_DIR=saved))
"""

from __future__ import annotations

import contextlib
import os
import secrets

from . import _cache_trust as trust
from ._cache_keys import ENTRY_NAME, cache_dir, max_bytes

__all__ = ["Refused", "read", "write", "exists", "remove", "disk_info", "delete_entries"]

_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_NONBLOCK", 0))
_NEW_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_CLOEXEC", 0))


class Refused(Exception):
    """An entry was not read: the file is not yours, others can write it, or its tag
    is wrong or missing. It has been deleted."""


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


@contextlib.contextmanager
def _opened(directory: str, *, create: bool):
    """``(descriptor, secret)`` of the cache directory, or ``None`` when the directory
    or the key is not trusted (or the directory cannot be opened and not ``create``)."""
    with trust.trusted_dir(directory, create=create) as dir_fd:
        key = None if dir_fd is None else trust.secret()
        yield None if key is None else (dir_fd, key)


def read(directory: str, name: str) -> memoryview | None:
    """The authenticated body of entry ``name``; ``None`` when there is none, or the
    directory is missing or not trusted. Raises :class:`Refused` (after deleting the
    file) when the file fails a check."""
    with _opened(directory, create=False) as opened:
        if opened is None:
            return None
        dir_fd, key = opened
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:   # a symbolic link (ELOOP), ...
            _unlink(dir_fd, name)
            raise Refused(f"it cannot be opened safely ({exc.strerror or exc})") from None
        try:
            reason = trust.entry_problem(os.fstat(fd))
            if reason is not None:
                _unlink(dir_fd, name)
                trust.refuse_entry(directory, name, reason)
                raise Refused(reason)
            with os.fdopen(os.dup(fd), "rb") as fh:
                blob = fh.read()
            body = trust.unseal(key, name, blob)
            if body is None:
                _unlink(dir_fd, name)
                raise Refused("its authentication tag is wrong or missing")
            try:
                os.utime(fd)   # least recently used order for the size bound
            except OSError:
                pass
            return body
        finally:
            os.close(fd)


def write(directory: str, name: str, body: bytes) -> bool:
    """Store ``body`` as entry ``name`` (authenticated, atomic), then keep the directory
    within its size bound. ``False`` when the directory or the key is not trusted
    (memory only); ``OSError`` when the directory cannot be made or written."""
    with _opened(directory, create=True) as opened:
        if opened is None:
            return False
        dir_fd, key = opened
        tmp = ".tmp-" + secrets.token_hex(8)
        fd = os.open(tmp, _NEW_FLAGS, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(trust.seal(key, name, body))
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            _unlink(dir_fd, tmp)
            raise
        _trim(dir_fd)
    return True


def exists(directory: str, name: str) -> bool:
    """Whether entry ``name`` is on disk in a trusted directory (not read nor checked
    further: :func:`read` may still refuse it)."""
    with trust.trusted_dir(directory, create=False) as dir_fd:
        if dir_fd is None:
            return False
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size > 0
        except OSError:
            return False


def remove(directory: str, name: str) -> None:
    """Delete entry ``name`` (one that could not be used)."""
    with trust.trusted_dir(directory, create=False) as dir_fd:
        if dir_fd is not None:
            _unlink(dir_fd, name)


def _scan(dir_fd: int) -> list:
    """``[(mtime, size, name), ...]`` of the cache's own files."""
    out = []
    with os.scandir(dir_fd) as it:
        for e in it:
            if ENTRY_NAME.match(e.name):
                st = e.stat(follow_symlinks=False)
                out.append((st.st_mtime, st.st_size, e.name))
    return out


def _trim(dir_fd: int) -> None:
    limit = max_bytes()
    try:
        sizes = _scan(dir_fd)
    except OSError:
        return
    total = sum(s for _, s, _ in sizes)
    if total <= limit:
        return
    for _, size, name in sorted(sizes):
        if name.endswith(".xla"):
            _unlink(dir_fd, name)
            total -= size
            if total <= 0.75 * limit:
                break


def disk_info() -> dict:
    """What the cache holds on disk: ``directory`` (``None`` when off), ``entries``
    (compiled programs and stored metadata), ``bytes``, ``max_bytes``, ``refused``: why
    the directory is not used (see :mod:`adaptprec._cache_trust`), or ``None``, and
    ``fix``: how to fix that. The ``python -m adaptprec cache`` command prints it.

    Example:
        >>> import os, tempfile
        >>> from adaptprec import _disk_cache as dc
        >>> saved, os.environ["ADAPTPREC_CACHE_DIR"] = os.environ.get("ADAPTPREC_CACHE_DIR"), tempfile.mkdtemp()
        >>> dc.disk_info()["entries"], dc.disk_info()["bytes"], dc.disk_info()["refused"]
        (0, 0, None)
        >>> _ = (os.environ.pop("ADAPTPREC_CACHE_DIR") if saved is None
        ...      else os.environ.update(ADAPTPREC_CACHE_DIR=saved))
    """
    directory = cache_dir()
    info = {"directory": directory, "entries": 0, "bytes": 0, "max_bytes": max_bytes(),
            "refused": None, "fix": None}
    if directory is None:
        return info
    why = trust.refused(directory)
    if why is not None:
        info["refused"], info["fix"] = why
        return info
    with trust.trusted_dir(directory, create=False) as dir_fd:
        if dir_fd is not None:
            for _, size, _ in _scan(dir_fd):
                info["entries"] += 1
                info["bytes"] += size
    return info


def delete_entries() -> int:
    """Delete the cache's files from its directory (only ``<hash>.xla`` and temporary
    files: anything else there is left alone; nothing in a directory that is not
    trusted). Returns the number of files deleted."""
    directory = cache_dir()
    if directory is None:
        return 0
    removed = 0
    with trust.trusted_dir(directory, create=False) as dir_fd:
        if dir_fd is not None:
            for _, _, name in _scan(dir_fd):
                try:
                    os.unlink(name, dir_fd=dir_fd)
                    removed += 1
                except OSError:
                    pass
    return removed
