"""Where the simulator's commands write their results (`--json`, `--plot`, `--out`):
checked before a run starts, so a path that cannot be written is a usage error naming
it, not a traceback after minutes of simulation with the results lost; written with the
missing folders made (`write_output`)."""

from __future__ import annotations

import os
from pathlib import Path


def output_problem(flag: str, path: str | None, folder: bool = False) -> str | None:
    """What keeps `path` (given as `flag`) from being written: a directory where a file
    goes (a file where a folder goes, with `folder`), or no writable directory above it
    (missing folders below one are made). None when it can be written, or no path."""
    if not path:
        return None
    p = Path(path)
    if p.exists() and p.is_dir() != folder:
        return f"{flag} {path}: is {'a file' if folder else 'a directory'}"
    above = p.parent
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        return f"{flag} {path}: {above} is a file, not a directory"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"{flag} {path}: {above} is not writable"
    return None


def write_output(path: str, text: str) -> Path:
    """Write `text` to `path` (a file), making the missing folders above it first: the
    ones `output_problem` accepted. Returns the path written."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p
