"""The benchmarks' memory readings of their own process, from ``/proc/self`` (Linux).

``VmHWM`` (the resident-set high-water mark) is each process's own: unlike ``getrusage().ru_maxrss``, which
Linux carries over ``fork`` and ``execve``, a child started by a parent holding models does not report at
least the parent's peak. Writing 5 to ``/proc/self/clear_refs`` resets it to the current resident set.
The scripts beside this file import it by name (their folder is the first entry of ``sys.path``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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


def measured_in_child(script: str, args: list[str]) -> dict:
    """Run ``script`` with ``args`` in a fresh Python process with glibc's mmap threshold pinned at 1 MiB (blocks of
    1 MiB or more are then mmap'ed and returned to the system when freed, so peaks do not depend on what the
    allocator kept), and return the JSON object its last stdout line prints; a failure raises with its last line."""
    child = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                           env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)})
    if child.returncode != 0:
        raise RuntimeError(child.stderr.strip().splitlines()[-1] if child.stderr.strip()
                           else f"exit code {child.returncode}")
    return json.loads(child.stdout.strip().splitlines()[-1])
