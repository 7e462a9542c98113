"""Which matrix a `--matrix-plots` folder holds the plots of.

A row's plot is named `<trace key>_<condition>.png`, and a run removes the plot of a row
that meets every goal. The quick matrix runs long-context and diurnal under the same
keys as the full one, on 5-minute slices at a quarter of the rate, so a quick run
pointed at the full matrix's folder would overwrite those rows' plots with its own and
remove the plots of the rows it meets. The folder therefore keeps a record
(`OWNER_FILE`) of the traces its plots replay (key, trace spec, rate multiplier, seconds
replayed), and a run whose traces replay differently under a key the folder already
has is refused before any cell runs. Conditions are not recorded: a condition's name
is its scenario (the full and combined matrices share traces and never a condition
name), and a matrix that gains a condition keeps writing where it did.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable
from typing import Any, Protocol

OWNER_FILE = ".matrix-traces.json"


class _Trace(Protocol):
    key: str
    spec: str
    rate_scale: float
    duration_s: float | None


def _record(traces: Iterable[_Trace]) -> dict[str, dict[str, Any]]:
    return {
        t.key: {"spec": t.spec, "rate_scale": t.rate_scale, "duration_s": t.duration_s}
        for t in traces
    }


def _held(folder: str) -> dict[str, dict[str, Any]]:
    """The record a folder holds ({} when it has none); ValueError if it is unreadable."""
    path = pathlib.Path(folder, OWNER_FILE)
    if not path.exists():
        return {}
    try:
        held = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e}); remove it or pick another folder") from None
    if not isinstance(held, dict) or not all(isinstance(v, dict) for v in held.values()):
        raise ValueError(f"{path}: not a record of traces; remove it or pick another folder")
    return held


def check_plots_dir(folder: str, traces: Iterable[_Trace]) -> None:
    """ValueError naming the trace when `folder` holds plots of a trace under one of
    `traces`' keys that replays differently (the quick matrix's long-context into the
    full matrix's folder, say); nothing is written."""
    _check(folder, _held(folder), traces)


def _check(folder: str, held: dict[str, dict[str, Any]], traces: Iterable[_Trace]) -> None:
    for key, want in _record(traces).items():
        have = held.get(key)
        if have is not None and have != want:
            raise ValueError(
                f"{folder} holds the plots of {key!r} as {_text(have)}; this matrix runs "
                f"it as {_text(want)}: pick another --matrix-plots folder"
            )


def claim_plots_dir(folder: str, traces: Iterable[_Trace]) -> None:
    """Record `traces` in `folder` (creating it), keeping the traces other runs recorded."""
    held = _held(folder)
    _check(folder, held, traces)
    path = pathlib.Path(folder, OWNER_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = held | _record(traces)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def _text(rec: dict[str, Any]) -> str:
    span = "all of it" if rec.get("duration_s") is None else f"{rec['duration_s']:g} s"
    return f"{rec.get('spec')} x{rec.get('rate_scale')}, {span}"
