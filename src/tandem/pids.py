"""Whether a process still runs, by its process id."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether `pid` still runs. A zombie (exited, not yet reaped by its parent) does not:
    a process that waits for a peer or a guardian must not wait for one of those."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        pass  # no /proc here: ask the kernel instead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True
