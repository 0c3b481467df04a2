"""Why a path cannot be opened, in words for an error message.

Imports nothing of the package, so that every layer (the data readers, the checks, the pipeline) can
name the real cause of a missing file the same way. The environment variables naming the embedded
pairs' artifact folders live here too: the message for a file where a folder should be names the
variable that points at it. So does :func:`looks_like_path`, which tells a local path from a hub id.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

TINY_ROOT_ENV = "MGSR_TINY_DIR"
# artifact folder of each embedded pair
ROOT_ENVS = {"tiny": TINY_ROOT_ENV, "reason": "MGSR_REASON_DIR", "facts": "MGSR_FACTS_DIR"}


def describe_missing(path: str | Path) -> str:
    """Why ``path`` cannot be opened, for an error message: ``not found: <path>``, or the real cause when it
    is something else (a symbolic link loop, a link to nothing, a file where a folder should be, or the
    other kind of entry than the one wanted when ``path`` exists)."""
    path = Path(path).expanduser()
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return f"{path} is (or goes through) a symbolic link loop: a link that leads back to itself"
        if error.errno == errno.ENOTDIR:
            file = next((parent for parent in path.parents if parent.is_file()), None)
            if file is not None:
                env = [name for name in sorted(set(ROOT_ENVS.values())) if os.environ.get(name)
                       and Path(os.environ[name]).expanduser().absolute() == file.absolute()]
                hint = (f" ({env[0]}={os.environ[env[0]]} names that file; point {env[0]} at the folder that "
                        "`prepare` or `prepare-tiny` filled)") if env else ""
                return f"{path} cannot exist: {file} is a file, not a folder{hint}"
        if error.errno == errno.ENOENT and os.path.lexists(path):
            return f"{path} is a symbolic link to {os.readlink(path)}, which does not exist"
        return f"not found: {path}"
    return f"{path} is a folder, not a file" if path.is_dir() else f"{path} is a file, not a folder"


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id (``org/name``): absolute, relative-marked, or with 2+ separators."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") >= 2 or os.sep != "/" and os.sep in name
