"""Write files so that a reader never sees half of one: temp file in the same directory, then rename."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


def missing_folders(directory: str | os.PathLike[str]) -> list[Path]:
    """`directory` and those of its parents that do not exist yet, deepest first: what
    `mkdir(parents=True)` would create, and what a failed command then removes (remove_empty_folders)."""
    missing = []
    for folder in (Path(directory), *Path(directory).parents):
        if os.path.lexists(folder):  # False also where the OS refuses the name
            break
        missing.append(folder)
    return missing


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove those of `folders` (deepest first, as missing_folders lists them) that are empty."""
    for folder in folders:
        with suppress(OSError):  # never made (a parent may have been), or written to meanwhile: kept
            folder.rmdir()


@contextmanager
def folders_undone_on_failure(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Around code that creates `directory` (and its missing parents) and then uses it: if the block fails,
    the folders it created are removed again, deepest first, so a refused path (one the OS finds too long
    only once its parents exist) leaves nothing behind. Folders that existed before stay."""
    missing = missing_folders(directory)
    try:
        yield
    except BaseException:
        remove_empty_folders(missing)
        raise


def _written_beside(target: Path, text: str) -> Path:
    """`text` in a new temp file in `target`'s folder (made if missing), on disk: a rename publishes it."""
    with folders_undone_on_failure(target.parent):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            # mkstemp makes 0600; give the mode open() would, so CI can read the file as another user
            os.fchmod(handle.fileno(), 0o666 & ~_umask())
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_texts_atomic({Path(path): text})[0]


def write_texts_atomic(texts: dict[Path, str]) -> list[Path]:
    """Several files written all or none: each into a temp file beside it first, and only once every one is
    on disk are they renamed into place, so that a write that fails (a full disk, a folder not writable)
    leaves every file as it was. The renames, last, stay in the folders where the temp files were made."""
    written: list[tuple[Path, Path]] = []
    try:
        for target, text in texts.items():
            written.append((_written_beside(target, text), target))
        for tmp, target in written:
            os.replace(tmp, target)
    except BaseException:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        raise
    return [target for _, target in written]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def ensure_writable_dir(path: str | os.PathLike[str], option: str = "--output") -> Path:
    """Create `path` and prove a file can be written there, before any long work starts; `option` is the
    one a refusal tells the user to change."""
    from gpuval.errors import UsageError

    directory = Path(path)
    try:
        with folders_undone_on_failure(directory):
            directory.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".gpuval-probe.", dir=directory)
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise UsageError(
            f"output directory '{directory}' cannot be written ({exc.strerror or exc}); "
            f"pass {option} with a writable directory"
        ) from None
    return directory


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a folder's entries (names created, renamed or removed in it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | os.PathLike[str]) -> None:
    """Flush every file and folder under `path`, `path` included: their data is on disk before a rename
    publishes the folder, so a crash never leaves a renamed folder with empty or short files."""
    for folder, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)
