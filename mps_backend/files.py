"""Writing a program file safely: what every export (``export_model``'s CLI, every language-model family)
does to put a ``.pte`` at its output path.

- :func:`output_target`: the file an export to a path replaces, checked before any work (a directory, a
  device, a FIFO, a link into a missing folder are refused);
- :func:`write_atomically`: the bytes go to a temporary file beside the target, renamed into place once
  complete; an interrupted or failed write leaves the old file as it was, and the temporary files of
  writers killed earlier (:func:`writer_gone`) are removed by the next write;
- :func:`staging_path`, :func:`failed_path`, :func:`publish_checked`: a program that checks itself after
  it is written stays under a temporary name until its check passed, and is kept as ``NAME.failed.pte``
  beside the output otherwise (the output path left as it was).

Standard library only: the CLI and every family import it without the export pipeline.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import pathlib
import tempfile
from typing import IO, Callable

#: bytes of an output's name kept in the temporary names beside it: a name holds at most 255 bytes (NAME_MAX),
#: and a temporary name adds up to ~40 to the output's (a valid 254-byte -o name was refused as "File name too
#: long" about a temporary name)
TEMP_NAME_BYTES = 160


def real_path(path: str | os.PathLike, what: str = "output") -> pathlib.Path:
    """``path`` with every symlink resolved; a symlink loop is one OSError line naming it (``Path.resolve``
    raises a RuntimeError, a traceback out of the CLI)."""
    try:
        return pathlib.Path(path).resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, f"{what} {path} is a symlink loop (it never resolves to a file)") from None


def temp_stem(name: str) -> str:
    """``name`` as the temporary names beside it hold it: itself when short enough, else its first bytes, ``~``
    and a digest of the whole name (two long names still get distinct temporary names)."""
    raw = name.encode(errors="surrogateescape")
    if len(raw) <= TEMP_NAME_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return raw[: TEMP_NAME_BYTES - 13].decode(errors="ignore") + "~" + digest


def output_target(path: str | os.PathLike) -> pathlib.Path:
    """The file an export to ``path`` replaces, checked before any work: ``path`` itself, or for a
    symlink the file it points to (written through: the link stays, its target gets the new program,
    as ``cp`` does). A directory, or anything else that is not a regular file (a device such as
    /dev/full, a FIFO, a socket), is refused with OSError; so are a missing folder and a symlink loop."""
    path = pathlib.Path(path)
    target = real_path(path) if path.is_symlink() else path  # a symlink loop: one OSError line
    shown = f"{path} (a symlink to {target})" if target != path else str(path)
    if target.is_dir():
        raise IsADirectoryError(f"{shown} is a directory, not a file to write")
    if target.exists() and not target.is_file():
        raise FileExistsError(f"{shown} is not a regular file (a device, FIFO or socket): refusing to replace it")
    if path.is_symlink() and not target.parent.is_dir():
        raise FileNotFoundError(f"{shown}: folder {target.parent} does not exist")
    return target


def writer_gone(pid: str) -> bool:
    """Whether ``pid`` (the text of a temporary name) is the id of a process that no longer runs."""
    if not pid.isdigit() or len(pid) > 9:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def remove_stale_partials(path: pathlib.Path) -> None:
    """Remove the temporary files an earlier write to ``path`` left when its process was killed (SIGKILL
    runs no cleanup): ``.NAME.PID.*.partial`` whose PID is no longer a running process. A live writer's
    (another export to the same path) is left alone."""
    stem = temp_stem(path.name)
    for tmp in path.parent.glob(f".{glob.escape(stem)}.*.partial"):
        if writer_gone(tmp.name[len(stem) + 2 :].split(".", 1)[0]):
            tmp.unlink(missing_ok=True)


def write_atomically(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> int:
    """``write(f)`` into a temporary file beside the target (:func:`output_target`), then rename it
    there: an interrupted export never leaves a truncated file nor destroys the file that was there,
    and a failed write (a full disk) leaves no temporary file; one killed (SIGKILL) leaves its temporary
    file, removed by the next write to the path. Returns the size."""
    path = output_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{temp_stem(path.name)}.{os.getpid()}.", suffix=".partial", dir=path.parent)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
        except OSError as e:  # ENOSPC, EIO, EDQUOT...: one line, the old file is intact
            raise OSError(e.errno, f"writing {path} failed ({e.strerror or e}); nothing was replaced") from e
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what open() would have given
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def staging_path(out: str | os.PathLike) -> pathlib.Path:
    """Where an export with a self-check writes its program until the check has passed: a hidden
    file beside the output, named as :func:`write_atomically`'s temporary files are, so that one left
    by a killed export is removed by the next write to the output."""
    target = output_target(out)
    return target.with_name(f".{temp_stem(target.name)}.{os.getpid()}.unverified.partial")


def failed_path(out: str | os.PathLike) -> pathlib.Path:
    """Where a program that failed its self-check is kept, beside the output: ``NAME.failed.pte`` (a long NAME
    shortened as temporary names are: :func:`temp_stem`)."""
    target = output_target(out)
    return target.with_name(f"{temp_stem(target.stem)}.failed{target.suffix or '.pte'}")


def publish_checked(written: pathlib.Path, out: str | os.PathLike, ok: bool) -> pathlib.Path:
    """Put a self-checked program in place: at the output path when the check passed (an atomic
    rename, replacing what was there); otherwise at :func:`failed_path`, leaving the output path as it
    was (a file that was there stays). Returns where the program is."""
    where = output_target(out) if ok else failed_path(out)
    os.replace(written, where)
    return where


__all__ = [
    "TEMP_NAME_BYTES",
    "failed_path",
    "output_target",
    "publish_checked",
    "real_path",
    "remove_stale_partials",
    "staging_path",
    "temp_stem",
    "write_atomically",
    "writer_gone",
]
