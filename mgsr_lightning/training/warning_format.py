"""Warnings of this package printed with their class names.

Lightning replaces ``warnings.formatwarning`` with one that drops the category of any warning whose file
path contains "lightning", which every file of ``mgsr_lightning`` does: ``FarFromTeacherWarning`` would
print as a bare message, and could not be found in a log by its name. :func:`show_category_names` puts
the category back for warnings issued from this package's files or of this package's classes, as
Python prints them (``file:line: Category: message``, without the source line); every other warning is
formatted as before.
"""

from __future__ import annotations

import warnings
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the package, one folder up
PACKAGE = __name__.split(".")[0]


def _ours(category: type[Warning], filename: str) -> bool:
    if getattr(category, "__module__", "").split(".")[0] == PACKAGE:
        return True
    try:
        return Path(filename).resolve().is_relative_to(PACKAGE_DIR)
    except (OSError, ValueError):
        return False


def show_category_names() -> None:
    """Wrap the current ``warnings.formatwarning`` (Lightning's, which is installed first) once."""
    import lightning.fabric.utilities.warnings  # noqa: F401 - installs Lightning's formatter, so ours wraps it

    previous = warnings.formatwarning
    if getattr(previous, "shows_category_names", False):
        return

    def format_warning(message, category, filename, lineno, line=None) -> str:
        if _ours(category, filename):
            return f"{filename}:{lineno}: {category.__name__}: {message}\n"
        return previous(message, category, filename, lineno, line)

    format_warning.shows_category_names = True
    warnings.formatwarning = format_warning
