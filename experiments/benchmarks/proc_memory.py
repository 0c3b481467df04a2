"""The benchmarks' memory readings of their own process, from ``/proc/self`` (Linux).

``VmHWM`` (the resident-set high-water mark) is each process's own: unlike ``getrusage().ru_maxrss``, which
Linux carries over ``fork`` and ``execve``, a child started by a parent holding models does not report at
least the parent's peak. Writing 5 to ``/proc/self/clear_refs`` resets it to the current resident set.
The scripts beside this file import it by name (their folder is the first entry of ``sys.path``).
"""

from __future__ import annotations

import re
from pathlib import Path


def status_kib(key: str) -> int:
    """One ``/proc/self/status`` figure in KiB, e.g. ``VmHWM`` or ``VmRSS``; KeyError when it is absent."""
    match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if match is None:
        raise KeyError(key)
    return int(match.group(1))


def reset_peak_rss() -> None:
    """Make the peak (``VmHWM``) the current resident set."""
    Path("/proc/self/clear_refs").write_text("5")
