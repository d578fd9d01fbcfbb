"""Trust in the program cache's files: only yours, only what you wrote.

The cache's entries are pickles (a compiled executable's bytes and its pytree layout), and
unpickling can run any code: an entry someone else wrote would run their code as you. So
no byte is unpickled unless both checks below pass.

1. **Ownership and mode.** The cache directory, the secret key's directory and every
   file read must be owned by you (the effective user id) and not writable by group or
   others; the key file must not be open to them at all (mode 0600). The checks are made
   on open descriptors (``fstat``), and files are opened relative to the checked
   directory's descriptor with ``O_NOFOLLOW``: a path component renamed or replaced
   between the check and the read cannot redirect the read. The path's parent
   directories therefore need no check of their own: whoever can replace one can only
   point the cache at a directory of theirs (refused here) or at one of yours, whose
   entries must still pass check 2.

   A directory or key file that fails: one ``RuntimeWarning`` per process (which path,
   what is wrong, how to fix it) and memory only for the rest of the process: nothing
   is read from or written there. An entry file that fails, in a directory that passes,
   is not read: it is deleted (one warning per directory) and its program compiled again.

2. **Authentication.** A file is ``MAGIC + tag + body`` with
   ``tag = HMAC-SHA256(secret, MAGIC + file name + NUL + body)`` (RFC 2104), the secret
   being 32 random bytes of yours. The tag is compared (``hmac.compare_digest``) before
   any of the body is unpickled; a file whose tag is wrong or missing (planted, copied
   from someone else's cache, an older format, truncated, one byte changed) is deleted
   and its program compiled again. The name is in the tag, so one of your entries cannot
   stand in for another.

The secret lives in ``$ADAPTPREC_CACHE_KEY_FILE`` if set, else
``$XDG_DATA_HOME/adaptprec/cache-key``, else ``~/.local/share/adaptprec/cache-key``:
outside the cache directory, so copying someone's cache directory copies nothing you
will load. It is created on first use without a race: written whole to a new temporary
file (mode 0600, ``O_EXCL``) in its directory, then hard-linked to its name; ``link``
never replaces a file, so of two processes creating it at once one wins and the other
reads the winner's, and no reader sees part of a key. Deleting it is safe: the next
process creates another, and the old entries are compiled again.

On a platform without POSIX ownership and the ``*at`` calls (Windows) the disk cache is
not used: programs are kept in memory only.

Example:
    >>> from adaptprec._cache_trust import seal, unseal
    >>> secret, other = b"k" * 32, b"m" * 32
    >>> blob = seal(secret, "a.xla", b"body")
    >>> bytes(unseal(secret, "a.xla", blob)), unseal(other, "a.xla", blob)
    (b'body', None)
    >>> unseal(secret, "b.xla", blob) is None   # the name is authenticated too
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import sys
import threading
import warnings
from typing import NamedTuple

__all__ = ["POSIX", "trusted_dir", "refused", "Problem", "entry_problem", "refuse_entry",
           "secret", "key_file", "seal", "unseal"]

#: the first bytes of every cache file (the format is in it: an older file is refused)
MAGIC = b"adaptprec program cache 3\n"
#: bytes of an HMAC-SHA256 tag, and of the secret (RFC 2104, section 3: a key no
#: shorter than the hash's output)
TAG_BYTES = SECRET_BYTES = 32
#: whether ownership, modes and the descriptor-relative calls exist here (not Windows)
POSIX = (hasattr(os, "geteuid")
         and {os.open, os.stat, os.unlink, os.rename, os.link} <= os.supports_dir_fd
         and os.scandir in os.supports_fd)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

_lock = threading.Lock()
_refused: dict = {}          # path -> why it is not used (memory only for the process)
_warned_entries: set = set()   # directories whose bad entry files were reported
_secrets: dict = {}          # key file path -> the secret read or created


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


class Problem(NamedTuple):
    """Why a path is not used, and how to fix it (both go into the warning)."""

    reason: str
    fix: str


_OFF = "or set ADAPTPREC_CACHE_DIR=off"


def _fix(kind: str, path: str, shared: bool) -> str:
    """How to fix a ``kind`` ("directory", "key directory", "key file", "entry") that
    fails check 1. ``shared``: not yours alone by design (another user's, or with the
    sticky bit, as ``/tmp`` or a scratch disk), so not to be changed: the advice is then
    a directory of your own first; otherwise ``chmod`` first."""
    if kind == "entry":
        return "none needed: the file is deleted and its program compiled again"
    if kind == "key file":
        if shared:
            return ("delete it (a new key is made, and the cached programs are compiled "
                    f"again), or point ADAPTPREC_CACHE_KEY_FILE at a file of yours, {_OFF}")
        return f"run `chmod 600 {path}`, or delete it (a new key is made)"
    env = "ADAPTPREC_CACHE_KEY_FILE" if kind == "key directory" else "ADAPTPREC_CACHE_DIR"
    example = os.path.join(path, "adaptprec-" + _login())
    if kind == "key directory":
        example = os.path.join(example, "cache-key")
    mine = (f"point {env} at a directory of your own (one that does not exist is created "
            f"with mode 0700: {env}={example}, say)")
    if shared:
        return f"{mine}, {_OFF}"
    return f"run `chmod 700 {path}` if it is yours alone, or {mine}, {_OFF}"


def _login() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid
        return str(os.geteuid())


def problem(st: os.stat_result, path: str, kind: str) -> Problem | None:
    """Check 1 for ``path`` (a ``kind``: "directory", "key directory", "key file" or
    "entry") with status ``st``: ``None`` when it is yours and not writable by group or
    others (a file: a regular one; the key file: not open to them at all)."""
    uid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if kind in ("key file", "entry") and not stat.S_ISREG(st.st_mode):
        return Problem("it is not a regular file", _fix(kind, path, shared=True))
    if st.st_uid != uid:
        return Problem(f"it is owned by {_user(st.st_uid)}, not by you ({_user(uid)})",
                       _fix(kind, path, shared=True))
    if mode & 0o022:
        return Problem(f"it is writable by group or others (mode {mode:04o})",
                       _fix(kind, path, shared=bool(mode & stat.S_ISVTX)))
    if kind == "key file" and mode & 0o077:
        return Problem(f"it is readable by group or others (mode {mode:04o}; it must be "
                       "0600)", _fix(kind, path, shared=False))
    return None


def _stacklevel() -> int:
    """The ``warnings`` stack level of the first caller outside adaptprec (and its
    ``with`` blocks) of the function calling this one: the user's line."""
    inside = (os.path.dirname(os.path.abspath(__file__)), contextlib.__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _refuse(kind: str, path: str, why: Problem) -> None:
    """Memory only for the rest of the process for ``path``, and one warning saying why
    and how to fix it."""
    with _lock:
        if path in _refused:
            return
        _refused[path] = why
    danger = ("a file that someone else can write there could run their code as you"
              if kind == "directory" else "anyone who can read or replace your key can "
              "make files the cache trusts, and run their code as you")
    warnings.warn(
        f"adaptprec's program cache does not use its {kind} {path!r}: {why.reason}. "
        f"Cached programs are pickles, which run code when loaded, so {danger}. Compiled "
        f"programs are kept in memory only for this process. To fix it: {why.fix}.",
        RuntimeWarning, stacklevel=_stacklevel())


def refused(path: str) -> Problem | None:
    """Why directory ``path`` is not used (refused in this process, or failing check 1
    now), or ``None``; no warning (``python -m adaptprec cache`` prints it)."""
    if not POSIX:
        return Problem("this platform has no POSIX file ownership, which the cache's "
                       "checks need", "none: the programs are kept in memory")
    with _lock:
        why = _refused.get(path)
    if why is None:
        try:
            why = problem(os.stat(path), path, "directory")
        except OSError:
            return None
    return why


def _open_dir(path: str, create: bool, kind: str) -> int | None:
    if not POSIX or path in _refused:
        return None
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)   # (OSError: the caller's to report)
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except OSError:   # missing, not a directory, not readable: nothing to read there
        if create:
            raise
        return None
    why = problem(os.fstat(fd), path, kind)
    if why is not None:
        os.close(fd)
        _refuse(kind, path, why)
        return None
    return fd


@contextlib.contextmanager
def trusted_dir(path: str, *, create: bool, kind: str = "directory"):
    """The descriptor of directory ``path`` when it passes check 1, else ``None`` (with
    one warning per process); ``None`` too when it cannot be opened and not ``create``.
    ``create`` makes it (mode 0700) and raises ``OSError`` when it cannot."""
    fd = _open_dir(path, create, kind)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def entry_problem(st: os.stat_result) -> str | None:
    """Why an entry file with status ``st`` is not read (check 1), or ``None``."""
    why = problem(st, "", "entry")
    return None if why is None else why.reason


def refuse_entry(directory: str, name: str, reason: str) -> None:
    """Report (once per directory and process) an entry file that was not read."""
    with _lock:
        if directory in _warned_entries:
            return
        _warned_entries.add(directory)
    warnings.warn(
        f"adaptprec's program cache did not load {os.path.join(directory, name)!r}: "
        f"{reason}. Cached programs are pickles, which run code when loaded; the file was "
        "deleted and its program is compiled again. Every cache file should be yours with "
        "mode 0600 (`python -m adaptprec cache clear` empties the cache).",
        RuntimeWarning, stacklevel=_stacklevel())


def key_file() -> str:
    """Where the secret is kept (see the module docstring)."""
    env = os.environ.get("ADAPTPREC_CACHE_KEY_FILE")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"),
                                                           ".local", "share")
    return os.path.join(base, "adaptprec", "cache-key")


def _create_secret(dir_fd: int, name: str) -> bytes | None:
    """A new secret under ``name``, or ``None`` when another process made one first."""
    value = secrets.token_bytes(SECRET_BYTES)
    tmp = f".{name}.tmp-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(value)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            os.unlink(tmp, dir_fd=dir_fd)
    except FileExistsError:
        return None
    return value


def _read_secret(dir_fd: int, path: str) -> bytes | Problem | None:
    """The secret in key file ``path`` (opened in ``dir_fd``); the :class:`Problem`
    when the file fails check 1; ``None`` when there is none."""
    try:
        fd = os.open(os.path.basename(path),
                     os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:   # a symbolic link (ELOOP), ...
        return Problem(f"it cannot be opened safely ({exc.strerror or exc})",
                       _fix("key file", path, shared=True))
    try:
        st = os.fstat(fd)
        why = problem(st, path, "key file")
        if why is None and st.st_size != SECRET_BYTES:
            why = Problem(f"it holds {st.st_size} bytes, not a {SECRET_BYTES}-byte key",
                          _fix("key file", path, shared=True))
        return why if why is not None else os.read(fd, SECRET_BYTES)
    finally:
        os.close(fd)


def secret() -> bytes | None:
    """This user's secret (read, or created on first use), or ``None`` when it cannot
    be trusted or made (one warning per process; the cache is then memory only)."""
    path = key_file()
    with _lock:
        value = _secrets.get(path)
    if value is not None or not POSIX or path in _refused:
        return value
    directory, name = os.path.split(path)
    try:
        with trusted_dir(directory, create=True, kind="key directory") as dir_fd:
            if dir_fd is None:
                return None
            for _ in range(3):   # (made by another process meanwhile: read theirs)
                value = _read_secret(dir_fd, path)
                if value is None:
                    value = _create_secret(dir_fd, name)
                if value is not None:
                    break
    except OSError as exc:
        value = Problem(f"it cannot be created ({exc.strerror or exc})",
                        "point ADAPTPREC_CACHE_KEY_FILE at a file in a directory you "
                        f"can write, {_OFF}")
    if not isinstance(value, bytes):
        _refuse("key file", path, value or Problem("it keeps vanishing",
                                                   _fix("key file", path, shared=True)))
        return None
    with _lock:
        return _secrets.setdefault(path, value)


def _tag(secret_: bytes, name: str, body) -> bytes:
    h = hmac.new(secret_, MAGIC, hashlib.sha256)
    h.update(name.encode())
    h.update(b"\0")
    h.update(body)
    return h.digest()


def seal(secret_: bytes, name: str, body: bytes) -> bytes:
    """The file holding ``body`` under ``name``: ``MAGIC + tag + body``."""
    return MAGIC + _tag(secret_, name, body) + body


def unseal(secret_: bytes, name: str, blob: bytes) -> memoryview | None:
    """The body of a file read under ``name`` if its tag is right, else ``None``."""
    head = len(MAGIC) + TAG_BYTES
    if len(blob) < head or not blob.startswith(MAGIC):
        return None
    body = memoryview(blob)[head:]
    if not hmac.compare_digest(blob[len(MAGIC):head], _tag(secret_, name, body)):
        return None
    return body
