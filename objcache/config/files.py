"""Files objcache writes outside a store, published atomically without following a link
(docs/security.md, "Files objcache places outside a store").

:func:`publish_file` is the one routine every such file goes through: the stats file and
the Prometheus textfile (:mod:`objcache.observe.publish`), vLLM's AOT artifact
(objcache/integrations/vllm_aot.py), torch's CPU kernels (objcache/integrations/torch/
kernels.py), the environment fingerprint's cache (:mod:`objcache.config.fingerprint`) and
Triton's remote-mode marker (objcache/integrations/triton.py). The filesystem store's folder
walk (backends/objcache/backends/fs_folders.py) is built on the same pieces,
:func:`distrust` and :func:`open_folder`; they live here, in the config layer, because the
fingerprint (config) is the lowest of the callers (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Sequence

from objcache.errors import UnsafeFolder

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: How every folder below a trusted root is opened: never through a symlink.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW
#: How a new file is created: a fresh name, never an existing file, never through a symlink.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_CLOEXEC | O_NOFOLLOW


def distrust(st: os.stat_result, euid: int, *, group: bool = False) -> str | None:
    """Why a folder or file with this stat cannot be trusted, or None: owned by another
    user, or writable by others (or, unless ``group``, by its group). Whoever can write a
    folder can plant files and swap folders in it (docs/security.md, "Local filesystem")."""
    mode = stat.S_IMODE(st.st_mode)
    if not group and st.st_uid != euid:
        return f"is owned by another user (uid {st.st_uid})"
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not group):
        who = "others" if mode & stat.S_IWOTH else "its group"
        return f"is writable by {who} (mode {mode:o})"
    return None


def open_folder(
    parent: int, name: str, *, create: bool, mode: int, exact: bool = False
) -> int | None:
    """An fd of the folder ``name`` in the folder ``parent``, opened ``O_NOFOLLOW``; with
    ``create``, made ``mode`` (narrowed by the umask; with ``exact``, set to ``mode``
    after, best-effort) where absent. None where it is absent,
    or is a file, and not ``create``. A symlink is :class:`UnsafeFolder`, never followed; a
    file where a folder should be, with ``create``, is ``NotADirectoryError``."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            return None
    except NotADirectoryError:  # a symlink (O_NOFOLLOW), or a file
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeFolder(f"{name!r} is a symlink; refusing to follow it") from None
        if create:
            raise
        return None
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=parent)
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    if exact:
        with contextlib.suppress(OSError):
            os.fchmod(fd, mode)
    return fd


def write_all(fd: int, data: bytes | memoryview) -> None:
    """The low-level write loop (tests replace it to fail mid-write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _check_name(part: str) -> str:
    if not part or part in (".", "..") or "/" in part or "\0" in part:
        raise ValueError(f"not a plain file or folder name: {part!r}")
    return part


def publish_file(
    root: str | os.PathLike[str],
    parts: Sequence[str],
    data: bytes,
    *,
    mode: int = 0o644,
    dir_mode: int = 0o700,
    create_root: bool = False,
    replace: bool = True,
    sync_folder: bool = True,
) -> None:
    """Atomically replace the file ``root/parts[0]/.../parts[-1]`` with ``data``.

    ``root`` is a folder the caller trusts (named by the user or by the tool objcache
    serves): it is opened by its path, links included, and made (``dir_mode``) with
    ``create_root``. Below it nothing is followed: each folder of ``parts[:-1]`` is opened
    ``O_NOFOLLOW`` relative to its parent's fd (made ``dir_mode``, narrowed by the umask,
    where absent) and must be owned by this user and writable by nobody else, else
    :class:`UnsafeFolder` and nothing is written. The file is written to a fresh random name
    in the last folder (``O_CREAT | O_EXCL | O_NOFOLLOW``, so no leftover of a killed start
    and no planted link is ever reused), given exactly ``mode``, fsynced, and renamed over
    the final name relative to the folder's fd (a rename replaces a link at the final name,
    never follows it); the folder is then fsynced, best-effort, unless ``sync_folder`` is
    false (a name whose loss after a power cut is only a cache miss: the file's own data is
    still fsynced before it gets the name, so a name never shows a torn file). With
    ``replace`` false the file is hard-linked to the final name instead, which raises
    :class:`FileExistsError` where anything (a file, a link) already has that name: nothing
    is ever overwritten. On any error the temporary file is removed and the final name keeps
    what it had. Raises ``OSError``.
    """
    *folders, name = (_check_name(part) for part in parts)
    if create_root:
        os.makedirs(root, mode=dir_mode, exist_ok=True)
    euid = os.geteuid()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
    try:
        walked = os.fspath(root)
        for folder in folders:
            walked = os.path.join(walked, folder)
            try:
                child = open_folder(fd, folder, create=True, mode=dir_mode)
            except UnsafeFolder:
                raise UnsafeFolder(f"{walked} is a symlink; refusing to follow it") from None
            assert child is not None
            os.close(fd)
            fd = child
            why = distrust(os.fstat(fd), euid)
            if why is not None:
                raise UnsafeFolder(f"{walked} {why}; refusing to write there")
        _replace_in(fd, name, data, mode, replace, sync_folder)
    finally:
        os.close(fd)


def _replace_in(
    directory: int,
    name: str,
    data: bytes,
    mode: int,
    replace: bool = True,
    sync_folder: bool = True,
) -> None:
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(8)}"
    fd = os.open(tmp, CREATE_FLAGS, 0o600, dir_fd=directory)
    try:
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
        else:  # create only: a link fails on any name already there, never follows one
            os.link(tmp, name, src_dir_fd=directory, dst_dir_fd=directory, follow_symlinks=False)
            os.unlink(tmp, dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=directory)
        raise
    if sync_folder:
        with contextlib.suppress(OSError):
            os.fsync(directory)
