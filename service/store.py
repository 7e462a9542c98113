"""Persistence of targets (per-model SLA, bounds, policy; paused models) and runtime
state (the decider's hysteresis memory and the values published to KEDA and engines).

Two documents:

- targets (`controller.targets.TargetsDoc`): what operators set. In-cluster it is the
  ConfigMap `<name>`, key `targets.yaml` (declarative: kubectl or Helm may edit it; the
  service follows it with a Kubernetes watch (service.cmwatch), applies valid changes
  and refuses invalid ones, keeping the last valid set); otherwise part of a local JSON
  file. Revisions are opaque strings (the ConfigMap's resourceVersion, or a counter in
  the file) used for optimistic concurrency: a write names the revision it read and
  fails with `ConflictError` when the document changed since.
- state (`StateDoc`): written by the leader after every tick. In-cluster the ConfigMap
  `<name>-state`, gzip-compressed (service.cmstore); otherwise the same local file.

Times in `ModelState` are on the loop's monotonic clock, which restarts with the
process. The state document stores them as wall time (Unix seconds): `to_wall(state,
offset)` adds `offset = wall - monotonic` taken at save time, and `from_wall(doc,
offset)` subtracts the offset of the loading process, so "scaled up 40 s ago" survives a
restart as 40 s plus the downtime. (A wall clock set back during the downtime would put
the restored state in the future; `restore_offset` then treats the downtime as zero.)

Everything read from outside is validated on load: a corrupt or unreadable document is
a `StoreError` naming the place and the problem (a service refuses to start on a corrupt
local file); a missing one is simply absent (fresh start).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    TypeAdapter,
    ValidationError,
)

from controller.config import INT32_MAX, format_validation_error, load_yaml
from controller.feedback import CORRECTION_MAX, CORRECTION_MIN, KNOB_CORRECTION_MIN
from controller.plant import OVERHEAD_MAX_MS, SEQ_RATIO_MAX, SEQ_RATIO_MIN, SPEED_MAX, SPEED_MIN
from controller.targets import TargetError, TargetsDoc, targets_doc
from controller.types import Knobs, ModelState, PlantBelief, SavedState

STATE_FORMAT = "llm-governor/state/v1"
FILE_FORMAT = "llm-governor/store/v1"
TARGETS_KEY = "targets.yaml"
STATE_KEY = "state.json"
GENERATION_MAX = 2**63 - 1
"""The largest generation a state document may hold: the protos' uint64 carries it, and
every knob change after it still fits (a stored 2**64 - 1 would not take one more)."""

# Fields of the saved ModelState (`SavedState`, one flat record) holding a monotonic time
# (seconds), and (time, value) pair lists. Every SavedState field must be listed in one
# of these (a test checks it); names not (or no longer) in SavedState are skipped.
TIME_FIELDS = (
    "last_scale_up_s",
    "panic_until_s",
    "idle_since_s",
    "last_good_s",
    "first_good_s",
    "knob_candidate_since_s",
    "burst_at_s",
    "knob_running_until_s",
    "short_at_s",
    "short_sample_s",
    "plant_speed_jump_since_s",
    "plant_seq_off_since_s",
    "fleet_full_since_s",
    "fleet_calm_since_s",
    "fleet_whole_at_s",
    "knob_changed_at_s",
    "inflight_since_s",
    "prompt_rise_since_s",
    "output_rise_since_s",
)
TIME_PAIR_FIELDS = ("recommendations", "actions", "load_marks")
NESTED_TIME_FIELDS = {"load": "at_s"}  # HoltState.at_s
# Lists of records with times: field -> (time-list key, time key) of each record.
RECORD_TIME_FIELDS = {"rules": ("since_s", "fired_at_s")}  # RuleState
PLAIN_FIELDS = (
    "replicas",
    "knobs",
    "no_data_ticks",
    "capacity_correction",
    "knob_candidate",
    "knob_changes",
    "lengths",
    "burst_rps",
    "knob_running",
    "knob_running_replicas",
    "short_rps",
    "short_waiting",
    "short_noise_z2",
    "long_noise_z2",
    "plant_speed",
    "plant_speed_samples",
    "plant_speed_jump",
    "plant_seq_ratio",
    "plant_seq_fit",
    "plant_cold_start_s",
    "plant_overhead_ms",
    "plant_knob_correction",
)


class StoreError(Exception):
    """A store could not be read or written, or holds something invalid."""


class ConflictError(StoreError):
    """The document changed since the revision the writer read (optimistic concurrency)."""


class TargetsInvalidError(StoreError):
    """The stored targets are not valid. `revision` is the refused revision."""

    def __init__(self, where: str, revision: str, problems: list[str]) -> None:
        self.where = where
        self.revision = revision
        self.problems = problems
        super().__init__(
            f"{where} (revision {revision}): {len(problems)} problem(s): " + "; ".join(problems)
        )


# ---------------------------------------------------------------------- documents
class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Quantiles = tuple[
    NonNegativeFloat | None,
    NonNegativeFloat | None,
    NonNegativeFloat | None,
    NonNegativeFloat | None,
]
"""Latency quantiles p50, p90, p95, p99, ms (None = no data): a list in the document, to
keep the state of many models within a ConfigMap's 1 MiB."""


class LatencyDoc(_Doc):
    """A model's last observed latency distribution (see actuators.publisher)."""

    ttft: Quantiles = (None, None, None, None)
    itl: Quantiles = (None, None, None, None)
    e2e: Quantiles = (None, None, None, None)
    observed_at_unix_s: FiniteFloat


class PublishedDoc(_Doc):
    """A published value (see actuators.publisher.Published), wall times (Unix seconds).
    Bounded to what the served protos carry (int32 knobs and replicas, uint64
    generation; see `GENERATION_MAX`), times finite: a document outside them is invalid."""

    max_num_seqs: PositiveInt = Field(le=INT32_MAX)
    max_num_batched_tokens: PositiveInt = Field(le=INT32_MAX)
    generation: NonNegativeInt = Field(le=GENERATION_MAX)
    replicas: Annotated[int, Field(ge=0, le=INT32_MAX)] | None
    reason: str = Field(max_length=64)
    decided_at_unix_s: FiniteFloat | None
    latency: LatencyDoc | None = None


class StateDoc(_Doc):
    """Runtime state written by the leader after each tick. `models` holds each model's
    ModelState with times as Unix seconds (see `to_wall`)."""

    format: Literal["llm-governor/state/v1"] = STATE_FORMAT
    saved_at_unix_s: float
    leader: str = ""
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    published: dict[str, PublishedDoc] = Field(default_factory=dict)
    targets: TargetsDoc | None = None
    """The last valid target set this leader applied (kept when stored ones are refused)."""
    targets_revision: str = ""


@dataclass(frozen=True, slots=True)
class StoredTargets:
    """Targets as read from a store, with the revision they were read at."""

    revision: str
    doc: TargetsDoc


def parse_targets_yaml(text: str, where: str, revision: str) -> TargetsDoc:
    """Parse the ConfigMap's `targets.yaml`; TargetsInvalidError naming each problem."""
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise TargetsInvalidError(where, revision, [f"not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise TargetsInvalidError(
            where,
            revision,
            [f"<root>: must be a mapping with a 'models:' list (got {type(data).__name__})"],
        )
    return _targets_doc(data, where, revision)


def _targets_doc(data: Any, where: str, revision: str) -> TargetsDoc:
    """A stored target document, validated by controller.targets (the same checks and
    messages as every other path an edit takes); TargetsInvalidError naming each problem."""
    try:
        return targets_doc(data)
    except TargetError as exc:
        raise TargetsInvalidError(where, revision, exc.problems) from None


# ---------------------------------------------------------------------- state <-> wall
_STATE = TypeAdapter(SavedState)


def _shift(value: float | None, delta: float) -> float | None:
    return None if value is None else value + delta


def to_wall(state: ModelState, offset_s: float) -> dict[str, Any]:
    """JSON-able form of `state` with every monotonic time shifted by `offset_s`
    (= wall - monotonic, seconds) to Unix seconds."""
    d: dict[str, Any] = _STATE.dump_python(SavedState.of(state), mode="json")
    for f in TIME_FIELDS:
        if d.get(f) is not None:
            d[f] = _shift(d[f], offset_s)
    for f in TIME_PAIR_FIELDS:
        if d.get(f) is not None:
            d[f] = [[t + offset_s, v] for t, v in d[f]]
    for f, sub in NESTED_TIME_FIELDS.items():
        if d.get(f) is not None:
            d[f][sub] = d[f][sub] + offset_s
    for f, (times, at) in RECORD_TIME_FIELDS.items():
        if not d.get(f):
            d.pop(f, None)  # a model without rules saves the same document as before
        for rec in d.get(f) or ():
            rec[times] = [_shift(t, offset_s) for t in rec[times]]
            rec[at] = _shift(rec[at], offset_s)
    return d


MAX_STATE_BYTES = 64 * 1024 * 1024
"""The largest state document read, bytes of JSON (after decompression): 20 times the
~3 MB of 1,000 models; the 1 MiB of gzip a ConfigMap holds can inflate to ~1 GiB (a
1,000:1 bomb), which every follower's read would have held in memory, ~4.7x over."""


def parse_json_bytes(data: bytes, where: str, hint: str = "") -> Any:
    """`data` (UTF-8 JSON, at most MAX_STATE_BYTES) parsed; StoreError `where: ...hint`
    when it is larger, not UTF-8, not JSON or nested past the recursion limit (none of
    which may stop a tick or a start with a traceback)."""
    if len(data) > MAX_STATE_BYTES:
        raise StoreError(f"{where}: larger than {MAX_STATE_BYTES} bytes{hint}")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{where}: not JSON: {exc}{hint}") from None
    except RecursionError:
        raise StoreError(f"{where}: not JSON: nested too deeply{hint}") from None


def restore_offset(wall_s: float, monotonic_s: float, saved_at_unix_s: float) -> float:
    """The offset (wall - monotonic, seconds) to load a state saved at `saved_at_unix_s`
    with, in a process whose clocks read `wall_s` and `monotonic_s` now.

    Normally `wall_s - monotonic_s`. When the wall clock was set back during the
    downtime the save would lie in the future, and every restored cooldown and window
    would hold for as long as the clock went back; the offset then maps the save to
    now (downtime taken as zero), keeping the state's own spacing (a panic hold that
    had 30 s left still has 30 s). Example: saved at wall 10,000, clock set back 2 h,
    restarted at wall 2,800 and monotonic 50: offset 9,950 instead of 2,750.
    """
    offset = wall_s - monotonic_s
    if math.isfinite(saved_at_unix_s) and saved_at_unix_s - offset > monotonic_s:
        return saved_at_unix_s - monotonic_s
    return offset


MAX_AHEAD_S = 86_400.0
"""How far past its save a stored time may lie, seconds: a panic hold or a roll-out's
end lies ahead, none by more than the longest window a policy may set (a day). A panic
hold stored 30 years ahead had pinned its model at its size, in panic, with no error."""


def from_wall(
    data: Mapping[str, Any],
    offset_s: float,
    where: str = "state",
    saved_at_unix_s: float = math.nan,
) -> ModelState:
    """The ModelState stored by `to_wall`, shifted back by this process's `offset_s`
    (= wall - monotonic, seconds). StoreError naming the field when invalid, or when a
    time lies more than MAX_AHEAD_S after `saved_at_unix_s` (when finite)."""
    if not isinstance(data, Mapping):
        raise StoreError(f"{where}: must be a mapping (got {type(data).__name__})")
    latest = saved_at_unix_s + MAX_AHEAD_S if math.isfinite(saved_at_unix_s) else math.inf

    def back(value: Any, name: str) -> float:
        t = _finite(value, name)
        if t > latest:
            raise ValueError(
                f"{name}: {t:.0f} lies {t - saved_at_unix_s:.0f} s after the save; no hold "
                f"lasts past {MAX_AHEAD_S:.0f} s"
            )
        return t - offset_s

    try:
        d = dict(data)
        for f in TIME_FIELDS:
            if d.get(f) is not None:
                d[f] = back(d[f], f)
        for f in TIME_PAIR_FIELDS:
            if d.get(f) is not None:
                d[f] = [[back(t, f), v] for t, v in _pairs(d[f], f)]
        for f, sub in NESTED_TIME_FIELDS.items():
            if isinstance(d.get(f), Mapping) and d[f].get(sub) is not None:
                d[f] = dict(d[f]) | {sub: back(d[f][sub], f"{f}.{sub}")}
        for f, (times, at) in RECORD_TIME_FIELDS.items():
            if isinstance(d.get(f), list):
                d[f] = [_record_from_wall(r, times, at, back, f) for r in d[f]]
        state = _STATE.validate_python(d).state()
    except ValidationError as exc:
        raise StoreError(f"{where}: " + "; ".join(format_validation_error(exc))) from None
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{where}: {exc}") from None
    if state.replicas < 0:
        raise StoreError(f"{where}.replicas: must be >= 0 (got {state.replicas})")
    if state.knobs.max_num_seqs <= 0 or state.knobs.max_num_batched_tokens <= 0:
        raise StoreError(f"{where}.knobs: must be positive (got {state.knobs})")
    _check_plant(state.plant, where)
    return state


def _check_plant(plant: PlantBelief, where: str) -> None:
    """StoreError unless every learned factor is within the bounds the decider keeps it
    in (controller.plant): a hand-edited or corrupt document with a correction or speed
    of 0 loaded, and every tick of that model then raised ZeroDivisionError."""
    bounds = (
        ("capacity_correction", plant.capacity_correction, CORRECTION_MIN, CORRECTION_MAX),
        ("plant_knob_correction", plant.knob_correction, KNOB_CORRECTION_MIN, 1.0),
        ("plant_speed", plant.speed, SPEED_MIN, SPEED_MAX),
        ("plant_speed_jump", plant.speed_jump, SPEED_MIN, SPEED_MAX),
        ("plant_seq_ratio", plant.seq_ratio, SEQ_RATIO_MIN, SEQ_RATIO_MAX),
        ("plant_cold_start_s", plant.cold_start_s, 1e-3, math.inf),
        ("plant_overhead_ms", plant.overhead_ms, 0.0, OVERHEAD_MAX_MS),
    )
    for name, value, lo, hi in bounds:
        if value is not None and not lo <= value <= hi:
            raise StoreError(f"{where}.{name}: must be within [{lo:g}, {hi:g}] (got {value})")
    if plant.speed_samples < 0:
        raise StoreError(f"{where}.plant_speed_samples: must be >= 0 (got {plant.speed_samples})")


def _pairs(items: Any, where: str) -> list[Any]:
    """`items`, a list of [time, value] pairs; ValueError naming `where` otherwise."""
    if not isinstance(items, list) or not all(
        isinstance(x, list | tuple) and len(x) == 2 for x in items
    ):
        raise ValueError(f"{where}: must be a list of [time, value] pairs (got {items!r:.80})")
    return items


def _record_from_wall(
    rec: Any, times: str, at: str, back: Callable[[Any, str], float], where: str
) -> Mapping[str, Any]:
    """A saved record with its `times` list and `at` time taken `back` (checked, on the
    monotonic clock)."""
    if not isinstance(rec, Mapping):
        raise ValueError(f"{where}: each item must be a mapping (got {type(rec).__name__})")
    out = dict(rec)
    if isinstance(out.get(times), list):
        out[times] = [None if t is None else back(t, f"{where}.{times}") for t in out[times]]
    if out.get(at) is not None:
        out[at] = back(out[at], f"{where}.{at}")
    return out


def _finite(value: Any, name: str) -> float:
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{name}: must be a finite time in Unix seconds (got {value!r})")
    return f


def published_doc(knobs: Knobs, **kw: Any) -> PublishedDoc:
    """Shorthand used by the service to persist a published value."""
    return PublishedDoc(
        max_num_seqs=knobs.max_num_seqs, max_num_batched_tokens=knobs.max_num_batched_tokens, **kw
    )


def parse_state(raw: Any, where: str) -> StateDoc:
    """Validate a state document; StoreError naming each problem."""
    try:
        return StateDoc.model_validate(raw)
    except ValidationError as exc:
        raise StoreError(f"{where}: " + "; ".join(format_validation_error(exc))) from None


# ---------------------------------------------------------------------- store protocol
class Store(Protocol):
    """Where targets and state persist. Implementations are thread-safe."""

    description: str

    def load_targets(self) -> StoredTargets | None:
        """The stored targets; None when none are stored. TargetsInvalidError when the
        stored ones are invalid; StoreError when the store cannot be read."""
        ...

    def watched_targets(self) -> StoredTargets | None:
        """As `load_targets`, for the once-per-tick check for changes: a store that
        follows changes (the ConfigMap store's watch) answers from memory."""
        ...

    def save_targets(self, doc: TargetsDoc, expected_revision: str | None) -> str:
        """Write `doc`; with `expected_revision`, only if the stored targets are still at
        that revision (else ConflictError). Returns the new revision."""
        ...

    def load_state(self) -> StateDoc | None:
        """The stored state; None when none. StoreError when corrupt or unreadable."""
        ...

    def save_state(self, doc: StateDoc) -> None:
        """Write the state document (the leader's, once per tick)."""
        ...


class MemoryStore:
    """A store that keeps everything in memory (simulated runs, tests)."""

    description = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: StoredTargets | None = None
        self._state: StateDoc | None = None
        self._rev = 0

    def load_targets(self) -> StoredTargets | None:
        with self._lock:
            return self._targets

    def watched_targets(self) -> StoredTargets | None:
        return self.load_targets()

    def save_targets(self, doc: TargetsDoc, expected_revision: str | None) -> str:
        with self._lock:
            current = self._targets.revision if self._targets else ""
            if expected_revision is not None and expected_revision != current:
                raise ConflictError(
                    f"targets changed: at revision {current or 'none'}, not {expected_revision}"
                )
            self._rev += 1
            self._targets = StoredTargets(str(self._rev), doc)
            return str(self._rev)

    def load_state(self) -> StateDoc | None:
        with self._lock:
            return self._state

    def save_state(self, doc: StateDoc) -> None:
        with self._lock:
            self._state = doc


def _file_revision(raw: Any) -> str:
    """The revision of a file store's `targets` entry as `save_targets` compares it: its
    `revision` as a string ("" when it has none). A broken entry (a string or missing
    revision, which `load_targets` refuses) is replaced by an admin edit that builds on
    this same string; before, load and save spelled it differently ("?" against "7"), so
    every such edit retried five times and answered ABORTED "targets kept changing"."""
    return str(raw["revision"]) if isinstance(raw, dict) and "revision" in raw else ""


class FileStore:
    """Targets and state in one local JSON file, written atomically (temp file in the
    same directory, fsync, rename, fsync of the directory): a crash leaves either the
    old or the new file, never a torn one.

    Layout: {"format": FILE_FORMAT, "targets": {"revision": N, "models": [...],
    "paused": [...]}, "state": StateDoc}.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.description = f"file {self.path}"
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ raw file
    def _read(self) -> dict[str, Any]:
        try:
            with self.path.open("rb") as fh:
                raw = fh.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        data = parse_json_bytes(
            raw,
            f"{self.path}: corrupt state file",
            "; move it away to start fresh, or restore a backup",
        )
        if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise StoreError(
                f"{self.path}: not an llm-governor state file (format {got!r}, "
                f"expected {FILE_FORMAT!r})"
            )
        return data

    def _write(self, data: dict[str, Any]) -> None:
        """Replace the file with `data`; StoreError naming the file when it cannot be
        written (disk full, read-only file system, no permission): the old one stays."""
        data = {"format": FILE_FORMAT} | data
        payload = json.dumps(data, indent=1, sort_keys=True).encode()
        directory = self.path.parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(payload)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write: {exc.strerror or exc}") from None
        with contextlib.suppress(OSError):  # not every platform can fsync a directory
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    # ------------------------------------------------------------------ targets
    def load_targets(self) -> StoredTargets | None:
        with self._lock:
            raw = self._read().get("targets")
        if raw is None:
            return None
        where = f"{self.path}: targets"
        if not isinstance(raw, dict) or not isinstance(raw.get("revision"), int):
            # The revision an admin edit then builds on (`save_targets` compares it).
            rev = _file_revision(raw)
            raise TargetsInvalidError(where, rev, ["targets: needs an integer 'revision'"])
        rev = str(raw["revision"])
        body = {k: v for k, v in raw.items() if k != "revision"}
        return StoredTargets(rev, _targets_doc(body, where, rev))

    def watched_targets(self) -> StoredTargets | None:
        return self.load_targets()

    def save_targets(self, doc: TargetsDoc, expected_revision: str | None) -> str:
        with self._lock:
            data = self._read()
            current = _file_revision(data.get("targets"))
            if expected_revision is not None and expected_revision != current:
                raise ConflictError(
                    f"targets changed: at revision {current or 'none'}, not {expected_revision}"
                )
            rev = int(current) + 1 if current.isdigit() else 1
            data["targets"] = {"revision": rev, **doc.model_dump(mode="json")}
            self._write(data)
            return str(rev)

    # ------------------------------------------------------------------ state
    def load_state(self) -> StateDoc | None:
        with self._lock:
            raw = self._read().get("state")
        return None if raw is None else parse_state(raw, f"{self.path}: state")

    def save_state(self, doc: StateDoc) -> None:
        with self._lock:
            data = self._read()
            data["state"] = doc.model_dump(mode="json")
            self._write(data)


def model_state_fields() -> set[str]:
    """Every saved ModelState field name (a test checks each one is classified above)."""
    return {f.name for f in fields(SavedState)}
