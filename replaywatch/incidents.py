"""The incident log: every finding's transitions, kept in SQLite across restarts.

    log = IncidentLog("/var/lib/replaywatch/incidents.db")   # no I/O yet
    log.connect()                                             # creates the schema
    active = {f.key: f for f in log.open_findings()}          # resume, don't duplicate
    ...
    log.apply(transitions, context={"tables": [...], "probes": [...]})

One row per incident in `incidents` (opened, updated, closed) and an
append-only `events` table with each transition, its finding and the
snapshots around it. WAL lets the API read while the poller writes;
`synchronous=NORMAL` is durable across a crash or kill of this process (a
committed WAL frame is in the OS page cache) and only an OS crash or power
loss can drop the last commits, which costs an fsync per poll to avoid (FULL).

Writes never raise: an unwritable file, a full disk or a locked database sets
`last_error` (for /readyz), and the transitions wait in a bounded queue to be
written by the next `apply`.
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import enum
import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from replaywatch import codec
from replaywatch.diagnosis.lifecycle import Transition
from replaywatch.diagnosis.rhythm import Rhythm
from replaywatch.model import Finding, Name, Severity

Row = dict[str, Any]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    finding_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    severity TEXT NOT NULL,
    target TEXT NOT NULL,
    table_name TEXT NOT NULL,
    summary TEXT NOT NULL,
    evidence TEXT NOT NULL,
    fix TEXT NOT NULL,
    since REAL NOT NULL,
    last_seen REAL NOT NULL,
    resolved_at REAL,
    stacks TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS incidents_one_open
    ON incidents (finding_id) WHERE resolved_at IS NULL;
CREATE INDEX IF NOT EXISTS incidents_since ON incidents (since);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id INTEGER NOT NULL REFERENCES incidents (id),
    transition TEXT NOT NULL,
    at REAL NOT NULL,
    finding TEXT NOT NULL,
    context TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_incident ON events (incident_id);
CREATE TABLE IF NOT EXISTS rhythms (
    target TEXT NOT NULL,
    series TEXT NOT NULL,
    rhythm TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (target, series)
);
"""

_COLUMNS = ("id", "finding_id", "kind", "severity", "target", "table_name", "summary",
            "evidence", "fix", "since", "last_seen", "resolved_at", "stacks")
CLOSING = ("resolved", "gone")  # the transitions that close an incident
# The transition that closed it, from its newest event (events_incident indexes the lookup).
_CLOSED_AS = ("(SELECT transition FROM events WHERE events.incident_id = incidents.id"
              " AND transition IN ('resolved', 'gone') ORDER BY events.id DESC LIMIT 1)")


def jsonable(value: Any) -> Any:
    """dataclasses.asdict-style plain data; enums by their lowercase name."""
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return value


def dumps(value: Any) -> str:
    return json.dumps(jsonable(value), default=repr, sort_keys=True)


def finding_from_row(row: Row) -> Finding:
    return Finding(kind=Name(row["kind"]), severity=Severity[row["severity"].upper()],
                   target=row["target"], table=row["table"], summary=row["summary"],
                   evidence=row["evidence"], fix=row["fix"], since=row["since"],
                   last_seen=row["last_seen"], resolved_at=row["resolved_at"])


class IncidentLog:
    """SQLite incident log; one writer (the poller), readers on API threads."""

    def __init__(self, path: str, max_pending: int = 10_000, timeout_s: float = 2.0):
        self.path = path
        self.timeout_s = timeout_s  # how long a write waits on a locked database
        self.last_error: str | None = None
        self.dropped = 0  # transitions lost because the queue overflowed
        self._pending: collections.deque[tuple[Transition, str]] = collections.deque()
        self._max_pending = max_pending
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    # -- connection -------------------------------------------------------------------------
    def connect(self) -> bool:
        """Connects and creates the schema; False (and `last_error`) when it cannot."""
        with self._lock:
            return self._connection() is not None

    def _connection(self) -> sqlite3.Connection | None:
        if self._conn is not None:
            return self._conn
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, check_same_thread=False,
                                   isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
            except BaseException:
                conn.close()
                raise
        except (sqlite3.Error, OSError) as e:
            self.last_error = f"{type(e).__name__}: {e} ({self.path})"
            return None
        self._conn = conn
        self.last_error = None
        return conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- writing ----------------------------------------------------------------------------
    def apply(self, transitions: Iterable[Transition], context: dict[str, Any]) -> None:
        """Writes the transitions (and any left from failed calls) in one transaction."""
        with self._lock:
            ctx = dumps(context)
            for t in transitions:
                if len(self._pending) >= self._max_pending:
                    self._pending.popleft()
                    self.dropped += 1
                self._pending.append((t, ctx))
            conn = self._connection()  # also clears last_error once the file is usable again
            if conn is None or not self._pending:
                return
            def write() -> None:
                for t, c in self._pending:
                    self._write(conn, t, c)

            if not self._transaction(conn, write):
                return
            self._pending.clear()
            self.last_error = None

    def _write(self, conn: sqlite3.Connection, t: Transition, context: str) -> None:
        f = t.finding
        row = conn.execute("SELECT id FROM incidents WHERE finding_id = ? AND resolved_at IS NULL",
                           (f.finding_id,)).fetchone()
        values = (f.severity.label, f.summary, dumps(f.evidence), f.fix, f.last_seen,
                  f.resolved_at if t.kind in CLOSING else None)
        if row is None:  # new, or an update/resolve whose opening was never written
            cur = conn.execute(
                "INSERT INTO incidents (finding_id, kind, target, table_name, since, severity,"
                " summary, evidence, fix, last_seen, resolved_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (f.finding_id, f.kind, f.target, f.table, f.since, *values))
            incident_id = cur.lastrowid
        else:  # "opened" again after a restart resumes the open incident
            incident_id = row[0]
            conn.execute("UPDATE incidents SET severity=?, summary=?, evidence=?, fix=?,"
                         " last_seen=?, resolved_at=? WHERE id=?", (*values, incident_id))
        at = f.resolved_at if t.kind in CLOSING and f.resolved_at is not None else f.last_seen
        conn.execute("INSERT INTO events (incident_id, transition, at, finding, context)"
                     " VALUES (?,?,?,?,?)", (incident_id, t.kind, at, dumps(f), context))

    def attach_stacks(self, finding_id: str, stacks: dict[str, Any]) -> bool:
        """Stores the trainer's stacks on the open incident; False if none or on error."""
        with self._lock:
            conn = self._connection()
            if conn is None:
                return False
            try:
                cur = conn.execute("UPDATE incidents SET stacks=? WHERE finding_id=? AND"
                                   " resolved_at IS NULL", (dumps(stacks), finding_id))
            except (sqlite3.Error, OSError) as e:
                self.last_error = f"{type(e).__name__}: {e} ({self.path})"
                return False
            return cur.rowcount > 0

    def save_rhythms(self, rows: Iterable[tuple[str, str, Any]], at: float,
                     forget_before: float) -> bool:
        """Stores each (target, series, rhythm) learned (diagnosis/rhythm.py), so a restarted
        sidecar judges by the job's rhythm from its first poll; forgets series not updated
        since `forget_before` (a job long gone). False (and `last_error`) on error."""
        with self._lock:
            conn = self._connection()
            if conn is None:
                return False
            values = [(t, k, json.dumps(codec.encode(r)), at) for t, k, r in rows]

            def write() -> None:
                conn.executemany(
                    "INSERT INTO rhythms (target, series, rhythm, updated_at) VALUES"
                    " (?,?,?,?) ON CONFLICT (target, series) DO UPDATE SET"
                    " rhythm=excluded.rhythm, updated_at=excluded.updated_at", values)
                conn.execute("DELETE FROM rhythms WHERE updated_at < ?", (forget_before,))

            return self._transaction(conn, write)

    def _transaction(self, conn: sqlite3.Connection, write: Callable[[], object]) -> bool:
        """`write` in one transaction, rolled back if it raises; False (and `last_error`)
        when the database refused it. Called with the lock held."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                write()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except (sqlite3.Error, OSError) as e:
            self.last_error = f"{type(e).__name__}: {e} ({self.path})"
            return False
        return True

    def load_rhythms(self) -> dict[str, dict[str, Rhythm]]:
        """By target, then series: the rhythms a sidecar before this one learned."""
        out: dict[str, dict[str, Rhythm]] = {}
        for target, series, doc in self._query(
                "SELECT target, series, rhythm FROM rhythms ORDER BY target, series", ()):
            try:
                out.setdefault(target, {})[series] = codec.decode(Rhythm, json.loads(doc))
            except (ValueError, TypeError, KeyError):
                continue  # a row an older sidecar wrote differently: learned again
        return out

    # -- reading ----------------------------------------------------------------------------
    def open_findings(self) -> builtins.list[Finding]:
        """The findings of open incidents, to resume after a restart."""
        known = set(Name)
        # A kind a newer or older sidecar wrote and this one does not know is not resumed.
        return [finding_from_row(r) for r in self.list("open", limit=1_000_000)
                if r["kind"] in known]

    def open_incident_ids(self) -> dict[str, int]:
        """finding_id -> id of its open incident."""
        return {r["finding_id"]: r["id"] for r in self.list("open", limit=1_000_000)}

    def list(self, state: str = "open", target: str | None = None, kind: str | None = None,
             severity: str | None = None, limit: int = 100) -> builtins.list[Row]:
        """Incidents newest first, filtered; [] when the log cannot be read."""
        if state not in ("open", "resolved", "all"):
            raise ValueError(f"state ({state!r}) must be open, resolved or all")
        where: builtins.list[str] = []
        args: builtins.list[Any] = []
        if state != "all":
            where.append("resolved_at IS NULL" if state == "open" else "resolved_at IS NOT NULL")
        for column, value in (("target", target), ("kind", kind), ("severity", severity)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = f"SELECT {', '.join(_COLUMNS)}, {_CLOSED_AS} FROM incidents"
        sql += f" WHERE {' AND '.join(where)}" if where else ""
        return [self._incident(r) for r in self._query(sql + " ORDER BY id DESC LIMIT ?",
                                                        (*args, limit))]

    def get(self, incident_id: int) -> Row | None:
        """One incident with its stacks and every event, oldest first."""
        rows = self._query(f"SELECT {', '.join(_COLUMNS)}, {_CLOSED_AS} FROM incidents"
                           " WHERE id = ?", (incident_id,))
        if not rows:
            return None
        incident = self._incident(rows[0], with_stacks=True)
        events = self._query("SELECT id, transition, at, finding, context FROM events"
                             " WHERE incident_id = ? ORDER BY id", (incident_id,))
        incident["events"] = [
            {"id": e[0], "transition": e[1], "at": e[2], "finding": json.loads(e[3]),
             "context": json.loads(e[4])} for e in events]
        return incident

    def _query(self, sql: str, args: Sequence[Any]) -> builtins.list[tuple[Any, ...]]:
        with self._lock:
            conn = self._connection()
            if conn is None:
                return []
            try:
                return conn.execute(sql, tuple(args)).fetchall()
            except (sqlite3.Error, OSError):
                return []  # last_error reports writes; a failed read shows as empty

    @staticmethod
    def _incident(r: tuple[Any, ...], with_stacks: bool = False) -> Row:
        row = dict(zip((*_COLUMNS, "closed_as"), r))
        row["table"] = row.pop("table_name")
        row["evidence"] = json.loads(row["evidence"])
        stacks = row.pop("stacks")
        row["has_stacks"] = stacks is not None
        if with_stacks:
            row["stacks"] = json.loads(stacks) if stacks is not None else None
        row["state"] = "open" if row["resolved_at"] is None else "resolved"
        # how it closed: "resolved" (no longer found) or "gone" (its target left the watch)
        row["closed_as"] = None if row["resolved_at"] is None else row["closed_as"] or "resolved"
        return row
