"""SQLite history of runs: checklist reports, precision comparisons, benchmarks, long-document runs, generations,
server probes.

One file (WAL journal, a schema_version table, migrations applied in order), found at $TRIAGE_DB or
~/.cache/triage-console/history.sqlite. Every write is its own committed transaction, so a crash or a SIGKILL loses at
most the run that was in flight. A long run is written twice: begin_run() inserts it as "running" (with the process
that owns it), finish_run() marks it "finished", "failed" or "cancelled". A "running" row whose process is gone is reported, and
then stored, as "interrupted".

Thread-safe: one connection per Store and process, guarded by a lock (Streamlit runs every session's script in its
own thread); other processes are serialized by SQLite's own file locks (busy timeout). Pure stdlib.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import logging
import math
import os
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from core.errors import TriageError
from core.settings import settings

KINDS = ("checklist", "compare", "bench", "longdoc", "generate", "probe", "fleet", "quality", "sweep", "remedy",
         "golden-record", "golden-watch")
STATUSES = ("running", "finished", "failed", "cancelled", "interrupted")
TITLE_MAX = 160
PAYLOAD_MAX_BYTES = 32 * 2**20  # one run's JSON; a bigger one is refused with a message, never truncated silently
BUSY_TIMEOUT_S = 15.0
EXPORT_FORMAT = "triage-console-runs"


class StoreError(TriageError, RuntimeError):
    """The history database could not be opened, read or written; the message says what to do."""


# ---- schema ---------------------------------------------------------------------------------------------------
# Each migration takes the database from version N-1 to N inside one transaction (its statements run in order).
# Never edit a released migration: add the next one.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, ["""
        CREATE TABLE runs (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            kind        TEXT NOT NULL,
            title       TEXT NOT NULL,
            status      TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed', 'interrupted')),
            created_at  REAL NOT NULL,            -- unix seconds
            finished_at REAL,                     -- unix seconds; NULL while running or when interrupted
            owner       TEXT,                     -- host:pid:process start ticks of the process that ran it
            summary     TEXT,                     -- JSON object or NULL
            payload     TEXT NOT NULL,            -- JSON
            error       TEXT
        )""",
        "CREATE INDEX runs_kind_created ON runs (kind, created_at DESC)",
        "CREATE INDEX runs_status ON runs (status)",
    ]),
    # 2: a run the user cancelled is "cancelled", not "failed". SQLite cannot change a CHECK: rebuild the table.
    (2, ["""
        CREATE TABLE runs_v2 (
            id          INTEGER PRIMARY KEY AUTOINCREMENT,
            kind        TEXT NOT NULL,
            title       TEXT NOT NULL,
            status      TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed', 'cancelled', 'interrupted')),
            created_at  REAL NOT NULL,
            finished_at REAL,
            owner       TEXT,
            summary     TEXT,
            payload     TEXT NOT NULL,
            error       TEXT
        )""",
        "INSERT INTO runs_v2 (id, kind, title, status, created_at, finished_at, owner, summary, payload, error) "
        "SELECT id, kind, title, status, created_at, finished_at, owner, summary, payload, error FROM runs",
        "DROP TABLE runs",
        "ALTER TABLE runs_v2 RENAME TO runs",
        "CREATE INDEX runs_kind_created ON runs (kind, created_at DESC)",
        "CREATE INDEX runs_status ON runs (status)",
    ]),
    # 3: speeds measured by finished runs (prompt tokens/s of a prefill, load seconds, ...), so the hint before a
    # run comes from this machine's recent speed rather than from a constant.
    (3, ["CREATE TABLE speeds (what TEXT NOT NULL, setup TEXT NOT NULL, per_s REAL NOT NULL, at REAL NOT NULL)",
         "CREATE INDEX speeds_what_setup ON speeds (what, setup, at DESC)"]),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]


def default_path() -> Path:
    """$TRIAGE_DB, else ~/.cache/triage-console/history.sqlite (read on every call, so it can be changed)."""
    return settings().db or Path.home() / ".cache" / "triage-console" / "history.sqlite"


@dataclass
class Run:
    id: int
    kind: str
    title: str
    status: str
    created_at: float
    finished_at: float | None
    summary: dict | None
    payload: Any = None  # None in list_runs() (payloads can be large); filled by get_run()
    error: str | None = None
    owner: str | None = None  # host:pid:start ticks of the process that ran it

    @property
    def made_here(self) -> bool:
        """Run by this very process (the app server every browser session shares), not another console or CLI."""
        return bool(self.owner) and self.owner == _owner()

    @property
    def made_by(self) -> str:
        """'this app', or the host and pid of the console or command that ran it."""
        if self.made_here:
            return "this app"
        host, _, rest = (self.owner or "").partition(":")
        return f"{host} pid {rest.partition(':')[0]}" if host else "-"

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to end; None while running, when interrupted, or when saved without a start time."""
        if self.finished_at is None or self.finished_at == self.created_at:
            return None
        return self.finished_at - self.created_at

    @property
    def created_iso(self) -> str:
        return dt.datetime.fromtimestamp(self.created_at).astimezone().isoformat(timespec="seconds")

    @property
    def label(self) -> str:
        started = self.created_iso[:19].replace("T", " ")
        return f"#{self.id} · {self.kind} · {self.title} · {started} · {self.status}"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["created"] = self.created_iso
        d["duration_s"] = self.duration_s
        return d


# ---- JSON ------------------------------------------------------------------------------------------------------
def _plain(obj: Any) -> Any:
    """Anything a page hands over -> JSON-safe values: dataclasses, enums, paths, numpy scalars, sets; NaN and
    infinities become None (JSON has no NaN and browsers refuse it)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    if isinstance(obj, dict):
        return {str(_plain(k) if not isinstance(k, str) else k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _plain(dataclasses.asdict(obj))
    if isinstance(obj, enum.Enum):
        return _plain(obj.value)
    if isinstance(obj, (Path, dt.datetime, dt.date)):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return _plain(obj.tolist())
    if hasattr(obj, "to_dict"):
        return _plain(obj.to_dict())
    return str(obj)


def _dumps(obj: Any, what: str) -> str:
    text = json.dumps(_plain(obj), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    if len(text.encode()) > PAYLOAD_MAX_BYTES:
        raise StoreError(f"The run's {what} is {len(text.encode()) / 2**20:.1f} MiB of JSON; the history keeps at most "
                         f"{PAYLOAD_MAX_BYTES // 2**20} MiB per run. Save a smaller result (fewer prompts or tokens).")
    return text


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _clean_title(title: str) -> str:
    title = " ".join(str(title or "").split()) or "(untitled)"
    return title if len(title) <= TITLE_MAX else title[: TITLE_MAX - 1] + "\u2026"


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"Unknown run kind {kind!r}; use one of {', '.join(KINDS)}.")
    return kind


# ---- process identity (to tell a live "running" row from an interrupted one) ----------------------------------
def _start_ticks(pid: int) -> str | None:
    """The process start time in clock ticks since boot (field 22 of /proc/PID/stat), or None if it is gone or a
    zombie. Together with the PID it names one process, even after the PID is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _owner(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid) or '?'}"


def owner_alive(owner: str | None) -> bool | None:
    """True/False for a process on this host; None when it ran on another host (cannot tell: left as running)."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if host != socket.gethostname():
        return None
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    now = _start_ticks(pid)
    if now is None:
        return False
    return ticks in ("?", now)


# ---- the store -------------------------------------------------------------------------------------------------
class Store:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path).expanduser() if path else default_path()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid: int | None = None
        with self._lock:
            self._connect()

    # connection
    def _connect(self) -> sqlite3.Connection:
        """The connection of this process (a forked child opens its own: SQLite connections must not cross fork)."""
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        if self.path.is_dir():
            raise StoreError(f"The history path {self.path} is a directory; set TRIAGE_DB to a file path such as "
                             f"{self.path / 'history.sqlite'}.")
        conn = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous=FULL")  # a committed run survives a power cut too, not only a crash
            conn.execute("PRAGMA foreign_keys=ON")
            self._migrate(conn)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise StoreError(f"Could not open the history database {self.path}: {exc}. If it is not a database "
                                 "(or is damaged), move it away or set TRIAGE_DB to another file.") from exc
            if isinstance(exc, OSError):
                raise StoreError(f"Could not create the history database at {self.path}: {exc}. Set TRIAGE_DB to a "
                                 "writable file path.") from exc
            raise
        if str(mode).lower() != "wal":
            conn.close()
            raise StoreError(f"The history database {self.path} cannot use WAL journaling (got {mode!r}); put it on a "
                             "local disk (not a network share) by setting TRIAGE_DB.")
        self._conn, self._pid = conn, os.getpid()
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        for version, statements in MIGRATIONS:
            conn.execute("BEGIN IMMEDIATE")  # re-read under the write lock: two processes may open a new file at once
            try:
                current = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
                if current > SCHEMA_VERSION:
                    raise StoreError(f"The history database was written by a newer version of the console (schema "
                                     f"{current}, this one knows up to {SCHEMA_VERSION}). Upgrade the console or "
                                     "set TRIAGE_DB to another file.")
                if current < version:
                    for statement in statements:
                        conn.execute(statement)
                    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def schema_version(self) -> int:
        with self._lock:
            return self._connect().execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0

    def _write(self, sql: str, args: tuple) -> sqlite3.Cursor:
        """One statement in its own committed transaction."""
        with self._lock:
            conn = self._connect()
            try:
                conn.execute("BEGIN IMMEDIATE")
                cur = conn.execute(sql, args)
                conn.execute("COMMIT")
                return cur
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StoreError(f"Could not write to the history database {self.path}: {exc}.") from exc

    def _read(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._connect().execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"Could not read the history database {self.path}: {exc}.") from exc

    # writing
    def save_run(self, kind: str, title: str, payload: Any, summary: dict | None = None, *, status: str = "finished",
                 error: str | None = None, started_at: float | None = None, finished_at: float | None = None) -> int:
        """A finished, failed or cancelled run in one committed transaction; returns its id. started_at (unix seconds)
        gives the run a duration; without it the duration is unknown. finished_at: when it ended (a cancelled run's
        stop), else now."""
        if status not in ("finished", "failed", "cancelled"):
            raise ValueError("save_run stores finished, failed or cancelled runs; use begin_run for one that is "
                             "starting.")
        now = time.time() if finished_at is None else float(finished_at)
        start = now if started_at is None else min(float(started_at), now)
        cur = self._write(
            "INSERT INTO runs (kind, title, status, created_at, finished_at, owner, summary, payload, error) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (_check_kind(kind), _clean_title(title), status, start, now, _owner(),
             None if summary is None else _dumps(summary, "summary"), _dumps(payload, "payload"), error))
        return int(cur.lastrowid)

    def begin_run(self, kind: str, title: str, payload: Any = None, summary: dict | None = None) -> int:
        """Record a long run as running now; it shows as interrupted if this process dies before finish_run."""
        cur = self._write(
            "INSERT INTO runs (kind, title, status, created_at, owner, summary, payload) "
            "VALUES (?, ?, 'running', ?, ?, ?, ?)",
            (_check_kind(kind), _clean_title(title), time.time(), _owner(),
             None if summary is None else _dumps(summary, "summary"),
             _dumps(payload if payload is not None else {}, "payload")))
        return int(cur.lastrowid)

    def update_run(self, run_id: int, payload: Any = None, summary: dict | None = None) -> None:
        """Checkpoint partial results of a running run (what finished so far survives a crash)."""
        sets, args = [], []
        if payload is not None:
            sets.append("payload = ?"), args.append(_dumps(payload, "payload"))
        if summary is not None:
            sets.append("summary = ?"), args.append(_dumps(summary, "summary"))
        if sets:
            self._write(f"UPDATE runs SET {', '.join(sets)} WHERE id = ? AND status = 'running'", (*args, int(run_id)))

    def finish_run(self, run_id: int, payload: Any = None, summary: dict | None = None, *, status: str = "finished",
                   error: str | None = None, at: float | None = None) -> None:
        """at: when it ended (unix seconds; a cancelled run's stop), else now."""
        if status not in ("finished", "failed", "cancelled"):
            raise ValueError(f"A run finishes as 'finished', 'failed' or 'cancelled', not {status!r}.")
        sets, args = ["status = ?", "finished_at = ?", "error = ?"], [status, at or time.time(), error]
        if payload is not None:
            sets.append("payload = ?"), args.append(_dumps(payload, "payload"))
        if summary is not None:
            sets.append("summary = ?"), args.append(_dumps(summary, "summary"))
        cur = self._write(f"UPDATE runs SET {', '.join(sets)} WHERE id = ?", (*args, int(run_id)))
        if cur.rowcount == 0:
            raise StoreError(f"Run #{run_id} is not in the history (deleted meanwhile?); its result was not saved.")

    def add_speed(self, what: str, setup: str, per_s: float) -> None:
        """One measured speed (units a second) of `what` ("prefill tok/s", "load") on `setup`; the newest 50 kept."""
        if per_s > 0 and math.isfinite(per_s):
            self._write("INSERT INTO speeds (what, setup, per_s, at) VALUES (?, ?, ?, ?)",
                        (what, setup, per_s, time.time()))
            self._write("DELETE FROM speeds WHERE what = ? AND setup = ? AND at NOT IN (SELECT at FROM speeds WHERE "
                        "what = ? AND setup = ? ORDER BY at DESC LIMIT 50)", (what, setup, what, setup))

    def recent_speed(self, what: str, setup: str, last: int = 5) -> float | None:
        """The median of the last `last` speeds measured for (what, setup), or None when none was."""
        rows = self._read("SELECT per_s FROM speeds WHERE what = ? AND setup = ? ORDER BY at DESC LIMIT ?",
                          (what, setup, last))
        return sorted(r[0] for r in rows)[len(rows) // 2] if rows else None

    def delete_run(self, run_id: int) -> bool:
        return self._write("DELETE FROM runs WHERE id = ?", (int(run_id),)).rowcount > 0

    def mark_interrupted(self) -> int:
        """Store 'interrupted' for running rows whose process (on this host) is gone; returns how many."""
        rows = self._read("SELECT id, owner FROM runs WHERE status = 'running'")
        dead = [r["id"] for r in rows if owner_alive(r["owner"]) is False]
        for run_id in dead:
            self._write("UPDATE runs SET status = 'interrupted', error = COALESCE(error, ?) WHERE id = ? "
                        "AND status = 'running'",
                        ("The process running it ended before it finished (crash, kill or restart).", run_id))
        return len(dead)

    # reading
    def list_runs(self, kind: str | None = None, limit: int = 200, status: str | None = None) -> list[Run]:
        """Newest first, without payloads."""
        self.mark_interrupted()
        where, args = [], []
        if kind:
            where.append("kind = ?"), args.append(_check_kind(kind))
        if status:
            where.append("status = ?"), args.append(status)
        sql = ("SELECT id, kind, title, status, created_at, finished_at, summary, error, owner FROM runs"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at DESC, id DESC LIMIT ?")
        return [self._run(r) for r in self._read(sql, (*args, max(1, min(int(limit), 100_000))))]

    def get_run(self, run_id: int) -> Run | None:
        self.mark_interrupted()
        rows = self._read("SELECT * FROM runs WHERE id = ?", (int(run_id),))
        return self._run(rows[0], payload=True) if rows else None

    def count(self) -> int:
        return self._read("SELECT COUNT(*) FROM runs")[0][0]

    def export_runs(self, ids: Iterable[int]) -> str:
        """The chosen runs, payloads included, as one JSON document (missing ids are skipped)."""
        runs = [r for r in (self.get_run(i) for i in ids) if r is not None]
        doc = {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION,
               "exported_at": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
               "database": str(self.path), "runs": [r.to_dict() for r in runs]}
        return json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False)

    @staticmethod
    def _run(row: sqlite3.Row, payload: bool = False) -> Run:
        try:
            summary = _loads(row["summary"])
            body = _loads(row["payload"]) if payload else None
        except json.JSONDecodeError as exc:  # hand-edited or damaged row: show it, never crash the page
            summary, body = {"unreadable": f"stored JSON is damaged: {exc}"}, None
        return Run(row["id"], row["kind"], row["title"], row["status"], row["created_at"], row["finished_at"],
                   summary, body, row["error"], row["owner"])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


# ---- module-level API on the store at default_path() ------------------------------------------------------------
_STORES: dict[Path, Store] = {}
_STORES_LOCK = threading.Lock()


def get_store(path: str | os.PathLike | None = None) -> Store:
    """The process's Store for `path` (default: $TRIAGE_DB or the default file), opened once."""
    p = Path(path).expanduser() if path else default_path()
    with _STORES_LOCK:
        s = _STORES.get(p)
        if s is None or s._pid not in (None, os.getpid()):
            s = _STORES[p] = Store(p)
        return s


def save_run(kind: str, title: str, payload: Any, summary: dict | None = None, **kw) -> int:
    return get_store().save_run(kind, title, payload, summary, **kw)


def begin_run(kind: str, title: str, payload: Any = None, summary: dict | None = None) -> int:
    return get_store().begin_run(kind, title, payload, summary)


def update_run(run_id: int, payload: Any = None, summary: dict | None = None) -> None:
    get_store().update_run(run_id, payload, summary)


def finish_run(run_id: int, payload: Any = None, summary: dict | None = None, **kw) -> None:
    get_store().finish_run(run_id, payload, summary, **kw)


def add_speed(what: str, setup: str, per_s: float) -> None:
    """Keep a measured speed for later hints; a history that cannot be written only loses the hint."""
    quietly(lambda: get_store().add_speed(what, setup, per_s))


def recent_speed(what: str, setup: str) -> float | None:
    """This machine's recent speed of `what` on `setup` (median of the last five), or None."""
    return quietly(lambda: get_store().recent_speed(what, setup))


def list_runs(kind: str | None = None, limit: int = 200, status: str | None = None) -> list[Run]:
    return get_store().list_runs(kind, limit, status)


def get_run(run_id: int) -> Run | None:
    return get_store().get_run(run_id)


def delete_run(run_id: int) -> bool:
    return get_store().delete_run(run_id)


def export_runs(ids: Iterable[int]) -> str:
    return get_store().export_runs(ids)


WRITE_ERRORS = (StoreError, ValueError, TypeError)  # TypeError/ValueError: a payload JSON cannot hold
_WARNED: set[str] = set()


def quietly(call: Callable[..., Any], *args, **kwargs) -> Any:
    """Run a history call for a page or a job that must not fail because history could not be written: returns None
    instead (and logs the reason once per message) so the user still sees their result."""
    try:
        return call(*args, **kwargs)
    except WRITE_ERRORS as exc:
        msg = str(exc)
        if msg not in _WARNED:
            _WARNED.add(msg)
            logging.getLogger(__name__).warning("History not saved: %s", msg)
        return None


def record(kind: str, title: str, payload: Any, summary: dict | None = None, *, started_at: float | None = None,
           status: str = "finished", error: str | None = None, finished_at: float | None = None) -> int | None:
    """save_run that never raises (see quietly): the run's id, or None. started_at (unix seconds) gives it a
    duration; finished_at dates a cancelled run to its stop."""
    return quietly(save_run, kind, title, payload, summary, started_at=started_at, status=status, error=error,
                   finished_at=finished_at)


class RunRecorder:
    """A long run written to the history while it runs: stored as "running" by begin(), checkpointed by checkpoint()
    after every result, finished (or failed / cancelled, with what finished) by finish(). A store failure never stops
    the run: the first becomes `warning` (one line for the page or the CLI) and later checkpoints are skipped.

    A feature's recorder (core/quality/history.py, core/long_context/history.py) subclasses it with `kind` and
    _title(), _payload(**extra) and _summary() for what it has kept so far."""

    kind: str
    run_id: int | None = None
    warning: str | None = None  # the first store failure

    def _title(self) -> str:
        raise NotImplementedError

    def _payload(self, **extra) -> dict:
        raise NotImplementedError

    def _summary(self) -> dict:
        raise NotImplementedError

    def _try(self, fn: Callable[[], Any], always: bool = False) -> Any:
        if self.warning and not always:
            return None
        try:
            return fn()
        except WRITE_ERRORS as exc:
            self.warning = f"This run was not saved to the history: {exc}"
            return None

    def begin(self) -> None:
        self.run_id = self._try(lambda: begin_run(self.kind, self._title(), self._payload(), self._summary()))

    def checkpoint(self) -> None:
        if self.run_id is not None:
            self._try(lambda: update_run(self.run_id, self._payload(), self._summary()))

    def finish(self, error: str | None = None, cancelled: bool = False, extra: dict | None = None,
               at: float | None = None) -> None:
        """Stored as cancelled, failed (with `error`) or finished; `extra` goes into the payload; `at` dates the end
        (a cancelled run's stop, seen by core.engines.base.RunControl)."""
        if self.run_id is None:
            return

        def write() -> bool:
            finish_run(self.run_id, self._payload(cancelled=cancelled, **(extra or {})), self._summary(),
                       status="cancelled" if cancelled else "failed" if error else "finished", error=error, at=at)
            return True

        # Tried even after a failed checkpoint (a locked database passes): it writes every result at once.
        if self._try(write, always=True):
            self.warning = None


# ---- comparing two runs (pure) -----------------------------------------------------------------------------------
def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists are kept whole."""
    if not isinstance(d, dict):
        return {prefix or "value": d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def numeric_diff(a: dict | None, b: dict | None) -> list[dict]:
    """One row per numeric field present in either summary: A, B, B - A and the relative change in percent."""
    fa, fb = flatten(a or {}), flatten(b or {})
    rows = []
    for key in list(dict.fromkeys([*fa, *fb])):
        x, y = _number(fa.get(key)), _number(fb.get(key))
        if x is None and y is None:
            continue
        delta = None if x is None or y is None else y - x
        rel = None if delta is None or x == 0 else 100.0 * delta / abs(x)
        rows.append({"field": key, "A": x, "B": y, "B - A": delta, "change %": rel})
    return rows
