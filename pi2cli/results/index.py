"""The SQLite index over the run JSON files: one row per run, for fast listing and filtering.

The JSON files are the truth; the index is derived from them and can always be rebuilt. Every change is
one transaction (BEGIN IMMEDIATE), so concurrent writers queue on SQLite's lock instead of interleaving,
and a crash leaves the previous state. Opening the index brings it in line with runs/*.json (files
added, changed or removed behind its back), and a missing or unreadable index is rebuilt from scratch.

Reading never needs to write: listing opens the index read-only (Index.open_readonly, a `mode=ro` URI)
and uses it as is when it matches the files; when it does not and it cannot be updated (a read-only or
full disk, a lock), the listing is served from an in-memory copy (Index.in_memory) and the disk is left
alone. Run files are read only when they are regular files no larger than MAX_RUN_FILE_BYTES, opened
without following links and without blocking (read_run_file): a FIFO, a device node, a link to
/dev/zero or a 2 GB file in runs/ is one warning, never a hang or a read that fills memory.
"""

import datetime as dt
import errno
import json
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import quote

from pi2cli.errors import Pi2Error
from pi2cli.results import schema
from pi2cli.units import format_size

INDEX_VERSION = "2"  # 2: device, threads, decode_ts and commit_label columns

# The largest run file read. A run of 100,000 tokens with every per-token time is a few MB of JSON; a file
# above this is not a run pi2 wrote and is refused from its size alone, never read.
MAX_RUN_FILE_BYTES = 64 << 20

_COLUMNS = {
    "run_id": "TEXT PRIMARY KEY",
    "created_at": "TEXT NOT NULL",  # UTC, fixed format, so text order is time order
    "status": "TEXT NOT NULL",
    "error": "TEXT",
    "engine": "TEXT NOT NULL",
    "engine_label": "TEXT NOT NULL",
    "policy": "TEXT",
    "engine_version": "TEXT",
    "engine_commit": "TEXT",
    "model": "TEXT NOT NULL",
    "model_sha256": "TEXT",
    "quant": "TEXT",
    "synthetic": "INTEGER NOT NULL",
    "workload": "TEXT NOT NULL",
    "target": "TEXT NOT NULL",
    "target_kind": "TEXT NOT NULL",
    "device": "TEXT NOT NULL",  # schema.target_label: what every table shows and groups by
    "threads": "INTEGER",  # settings.threads (null: the engine's default)
    "budget_bytes": "INTEGER",
    "budget_enforced": "INTEGER NOT NULL",
    "n_turns": "INTEGER",
    "decode_ts": "REAL",  # schema.decode_rate: THE decode tok/s
    "avg_ts": "REAL",
    "stddev_ts": "REAL",
    "tbt_p50_ns": "INTEGER",
    "tbt_p99_ns": "INTEGER",
    "ttft_p50_ns": "INTEGER",
    "peak_rss_bytes": "INTEGER",
    "pi2_commit": "TEXT",
    "commit_label": "TEXT NOT NULL",  # schema.commit_label
    "path": "TEXT NOT NULL",
    "file_mtime_ns": "INTEGER NOT NULL",
    "file_size": "INTEGER NOT NULL",
}


def normalize_time(text: str) -> str:
    return schema.parse_time(text).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def row_for(run: dict, path: Path, st: os.stat_result | None = None) -> dict:
    """The index row of a (validated) run stored at `path` (st: its lstat, when already taken)."""
    summary = run.get("summary") or schema.summarize(run)
    st = st or os.lstat(path)
    return {
        "run_id": run["run_id"],
        "created_at": normalize_time(run["created_at"]),
        "status": run["status"],
        "error": run["error"],
        "engine": run["engine"]["name"],
        "engine_label": schema.engine_label(run),
        "policy": run["engine"]["policy"],
        "engine_version": run["engine"]["version"],
        "engine_commit": run["engine"]["commit"],
        "model": run["model"]["name"],
        "model_sha256": run["model"]["sha256"],
        "quant": run["model"]["quant"],
        "synthetic": int(run["model"]["synthetic"]),
        "workload": run["workload"]["name"],
        "target": run["target"]["name"],
        "target_kind": run["target"]["kind"],
        "device": schema.target_label(run),
        "threads": schema.run_threads(run),
        "budget_bytes": run["memory"]["budget_bytes"],
        "budget_enforced": int(run["memory"]["enforced"]),
        "n_turns": summary["n_turns"],
        "decode_ts": schema.decode_rate(run),
        "avg_ts": summary["avg_ts"],
        "stddev_ts": summary["stddev_ts"],
        "tbt_p50_ns": summary["tbt_p50_ns"],
        "tbt_p99_ns": summary["tbt_p99_ns"],
        "ttft_p50_ns": summary["ttft_p50_ns"],
        "peak_rss_bytes": summary["peak_rss_bytes"],
        "pi2_commit": run["pi2"]["commit"],
        "commit_label": schema.commit_label(run),
        "path": path.name,
        "file_mtime_ns": st.st_mtime_ns,
        "file_size": st.st_size,
    }


class Index:
    """A connection to one index for one runs/ directory: the file, read-write (Index(path, runs_dir)) or
    read-only (Index.open_readonly), or a copy in memory (Index.in_memory)."""

    def __init__(self, path: Path, runs_dir: Path, *, conn: sqlite3.Connection | None = None):
        self.path = Path(path)
        self.runs_dir = Path(runs_dir)
        self.warnings: list[str] = []  # from the last sync: one line per run file skipped
        self.notice: str | None = None  # an in-memory listing: why the index on disk was not updated
        self.readonly = False
        if conn is not None:
            self.conn = conn
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _check_index_file(self.path)
        try:
            self.conn = self._connect()
        except sqlite3.OperationalError:
            raise  # locked, read-only, no such directory...: a real problem, never a reason to delete
        except sqlite3.DatabaseError:
            # Not a database (truncated, overwritten): it is only derived data, so start again.
            self.path.unlink(missing_ok=True)
            self.conn = self._connect()

    @classmethod
    def open_readonly(cls, path: Path, runs_dir: Path) -> "Index":
        """The index file as it is, opened read-only (a `mode=ro` URI: nothing is written, not even a
        journal); sqlite3.Error when it is missing, not a database or of another version."""
        path = Path(path)
        _check_index_file(path)
        if not path.is_file():
            raise sqlite3.OperationalError(f"no index at {path}")
        conn = sqlite3.connect(readonly_uri(path), uri=True, timeout=60, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            version = conn.execute("SELECT value FROM meta WHERE key = 'index_version'").fetchone()
            if version is None or version[0] != INDEX_VERSION:
                raise sqlite3.DatabaseError(f"index version {version and version[0]!r}, not {INDEX_VERSION}")
            conn.execute("SELECT count(*) FROM runs").fetchone()
        except BaseException:
            conn.close()
            raise
        idx = cls(path, runs_dir, conn=conn)
        idx.readonly = True
        return idx

    @classmethod
    def in_memory(cls, path: Path, runs_dir: Path, source: "Index | None" = None) -> "Index":
        """An index in memory, copied from `source` when given (else empty): for a listing on a disk
        that cannot take a write. It is synced like the file but nothing reaches the disk."""
        conn = sqlite3.connect(":memory:", isolation_level=None)
        if source is not None:
            source.conn.backup(conn)
        conn.row_factory = sqlite3.Row
        idx = cls(path, runs_dir, conn=conn)
        if source is None:
            _create_tables(conn)
        return idx

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout = 60000")
        try:
            _create_tables(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def upsert(self, run: dict, path: Path) -> None:
        row = row_for(run, path)
        names = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with _transaction(self.conn):
            self.conn.execute(f"INSERT OR REPLACE INTO runs ({names}) VALUES ({marks})", tuple(row.values()))

    def plan_sync(self) -> tuple[list[str], list[dict], list[str]]:
        """What sync would change, read only: (run ids to drop, rows to add or replace, one warning per
        entry of runs/ that is not a usable run file). Unchanged files (same name, size and mtime) are
        not reread, so this costs one lstat per run."""
        # Rows first, files second: a run saved in between is then seen as a new file (re-added, harmless)
        # rather than as a row without a file (deleted until the next sync).
        known = {row["path"]: (row["file_mtime_ns"], row["file_size"], row["run_id"])
                 for row in self.conn.execute("SELECT path, file_mtime_ns, file_size, run_id FROM runs")}  # fmt: skip
        files, warnings = scan_runs_dir(self.runs_dir)
        stale = [known[name][2] for name in known if name not in files]
        # run_id -> the file that holds it: one row per run_id, so a second file with a stored run's id
        # (a copy, a planted file) is named and skipped, never silently swapped in for the first.
        owner = {rid: name for name, (_, _, rid) in known.items() if name in files}
        fresh = []
        for name, (path, st) in sorted(files.items()):
            if name in known and known[name][:2] == (st.st_mtime_ns, st.st_size):
                continue
            try:
                run = read_run_file(path)
                row = row_for(run, path, st)
                _check_storable(row, path)
                first = owner.get(row["run_id"], name)
                if first != name:
                    raise Pi2Error(
                        f"{path}: run {row['run_id']} is already {self.runs_dir / first} (a copy?)"
                    )
            except Pi2Error as err:
                warnings.append(str(err))
                if name in known and owner.get(known[name][2]) == name:
                    stale.append(known[name][2])
                    del owner[known[name][2]]
                continue
            if name in known and owner.get(known[name][2]) == name:
                del owner[known[name][2]]  # this file now holds another id (or the same, set again below)
            owner[row["run_id"]] = name
            fresh.append(row)
        return stale, fresh, warnings

    def apply_sync(self, stale: list[str], fresh: list[dict]) -> None:
        if stale or fresh:
            with _transaction(self.conn):
                self.conn.executemany("DELETE FROM runs WHERE run_id = ?", [(r,) for r in stale])
                for row in fresh:
                    names = ", ".join(row)
                    marks = ", ".join("?" for _ in row)
                    self.conn.execute(f"INSERT OR REPLACE INTO runs ({names}) VALUES ({marks})",
                                      tuple(row.values()))  # fmt: skip

    def sync(self) -> list[str]:
        """Bring the index in line with runs/*.json; returns one warning per entry that could not be used."""
        stale, fresh, warnings = self.plan_sync()
        self.apply_sync(stale, fresh)
        return warnings

    def query(
        self,
        *,
        model: str | None = None,
        engine: str | None = None,
        workload: str | None = None,
        since: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        device: str | None = None,
        threads: int | None = None,
    ) -> list[dict]:
        """Rows newest first. model: case-insensitive substring; engine: name or label (pi2:dense);
        workload: exact; since: ISO time (UTC when no zone); status: ok / aborted / ...; device: the
        target's name, kind or label (local, adb, 127.0.0.1:5555); threads: a count, 0 for the default."""
        where, args = [], []
        if device:
            where.append("(target = ? OR target_kind = ? OR device = ?)")
            args += [device, device, device]
        if threads is not None:
            where.append("threads IS NULL" if threads == 0 else "threads = ?")
            args += [] if threads == 0 else [threads]
        if model:
            where.append("instr(lower(model), lower(?)) > 0")
            args.append(model)
        if engine:
            where.append("(engine = ? OR engine_label = ?)")
            args += [engine, engine]
        if workload:
            where.append("workload = ?")
            args.append(workload)
        if since:
            where.append("created_at >= ?")
            args.append(normalize_time(since))
        if status:
            where.append("status = ?")
            args.append(status)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, run_id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [dict(row) for row in self.conn.execute(sql, args)]

    def find(self, ref: str) -> list[dict]:
        """Rows whose run id is `ref` or starts with it."""
        exact = self.conn.execute("SELECT * FROM runs WHERE run_id = ?", (ref,)).fetchall()
        if exact:
            return [dict(r) for r in exact]
        short = schema.SHORT_ID_RE.match(ref)
        if short:  # a short id (schema.short_run_id): TIME-...-HEX
            rows = self.conn.execute("SELECT * FROM runs WHERE run_id LIKE ? ORDER BY run_id",
                                     (f"{short.group(1)}-%-{short.group(2)}",)).fetchall()  # fmt: skip
            if rows:
                return [dict(r) for r in rows]
        like = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.conn.execute(
            "SELECT * FROM runs WHERE run_id LIKE ? ESCAPE '\\' ORDER BY run_id", (like,)
        )
        return [dict(r) for r in rows]


def _check_storable(row: dict, path: Path) -> None:
    """The schema's bounds keep every value SQLite-sized; this is the last guard, so one bad file can
    only ever be a warning, never an OverflowError that takes the whole directory down."""
    for key, value in row.items():
        if isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
            raise Pi2Error(f"{path}: {key} {value:.4g} does not fit the index")


def readonly_uri(path: Path) -> str:
    """The SQLite URI that opens `path` read-only: no write, no journal, no lock file created."""
    return f"file:{quote(str(Path(path).absolute()))}?mode=ro"


def _create_tables(conn: sqlite3.Connection) -> None:
    with _transaction(conn):
        columns = ", ".join(f"{name} {decl}" for name, decl in _COLUMNS.items())
        conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({columns})")
        conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at)")
        version = conn.execute("SELECT value FROM meta WHERE key = 'index_version'").fetchone()
        if version is None:
            conn.execute("INSERT INTO meta VALUES ('index_version', ?)", (INDEX_VERSION,))
        elif version[0] != INDEX_VERSION:
            conn.execute("DROP TABLE runs")
            conn.execute(f"CREATE TABLE runs ({columns})")
            conn.execute("CREATE INDEX runs_created ON runs (created_at)")
            conn.execute("UPDATE meta SET value = ? WHERE key = 'index_version'", (INDEX_VERSION,))


def _check_index_file(path: Path) -> None:
    """The index is a regular file or nothing: SQLite would block reading a FIFO put in its place."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise sqlite3.OperationalError(f"{path}: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise sqlite3.OperationalError(f"{path} is a {file_kind(st.st_mode)}, not a database file")


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        # A failed COMMIT (a full disk: SQLITE_FULL) may already have rolled back, and then ROLLBACK itself
        # fails with "cannot rollback - no transaction is active", hiding the real error: roll back only
        # what is still open, and let the first error through.
        if conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def file_kind(mode: int) -> str:
    """What a directory entry is, in words, for the one line that says why it was skipped."""
    for test, word in ((stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory")):  # fmt: skip
        if test(mode):
            return word
    return "regular file" if stat.S_ISREG(mode) else "special file"


def scan_runs_dir(runs_dir: Path) -> tuple[dict[str, tuple[Path, os.stat_result]], list[str]]:
    """({name: (path, lstat)} of the candidate run files in runs/, [one warning per other entry]).

    Candidates are regular *.json files no larger than MAX_RUN_FILE_BYTES; nothing is opened here and
    links are not followed, so a FIFO, a device node or a link to one costs one lstat. Hidden names
    (a save's temporary files) are left alone."""
    files: dict[str, tuple[Path, os.stat_result]] = {}
    warnings: list[str] = []
    try:
        entries = sorted(os.scandir(runs_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return files, warnings
    except OSError as err:
        return files, [f"{runs_dir}: cannot list: {err.strerror or err}"]
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = Path(runs_dir) / entry.name
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as err:
            warnings.append(f"{path}: cannot stat: {err.strerror or err}")
            continue
        problem = _not_a_run_file(path, st)
        if problem:
            warnings.append(problem)
        elif not entry.name.endswith(".json"):
            warnings.append(f"{path}: not a run file (runs/ holds <run id>.json files)")
        else:
            files[entry.name] = (path, st)
    return files, warnings


def _not_a_run_file(path: Path, st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: a {file_kind(st.st_mode)}, not a regular file (not read)"
    if st.st_size > MAX_RUN_FILE_BYTES:
        return (f"{path}: {format_size(st.st_size)}, larger than any run file "
                f"({format_size(MAX_RUN_FILE_BYTES)} at most; not read)")  # fmt: skip
    return None


def read_regular_file(path: Path, limit: int = MAX_RUN_FILE_BYTES) -> bytes:
    """The bytes of `path` if it is a regular file of at most `limit` bytes, else a Pi2Error naming it.

    Opened with O_NOFOLLOW (a link, say to /dev/zero, is refused, not followed) and O_NONBLOCK (a FIFO
    put in its place since it was listed is refused, not waited on), checked with fstat, read to the
    limit and no further."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Pi2Error(f"{path}: a symbolic link, not a regular file (not read)") from None
        raise Pi2Error(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        st = os.fstat(fd)
        problem = _not_a_run_file(path, st)
        if problem:
            raise Pi2Error(problem)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Pi2Error(f"{path}: grew past {format_size(limit)} while read (not a run file)")
        return b"".join(chunks)
    except OSError as err:
        raise Pi2Error(f"{path}: cannot read: {err.strerror or err}") from None
    finally:
        os.close(fd)


def read_run_file(path: Path) -> dict:
    """Load and validate one run JSON; a bad file is a Pi2Error naming it."""
    text = read_regular_file(Path(path))
    if not text.strip():
        raise Pi2Error(f"{path}: empty (a save that was cut short?)")
    try:
        run = json.loads(text.decode("utf-8"))
    except json.JSONDecodeError as err:
        cut = " (truncated?)" if err.pos >= len(text.rstrip()) else ""
        raise Pi2Error(f"{path}: not JSON: {err.msg} (line {err.lineno}, column {err.colno}){cut}") from None
    except UnicodeDecodeError as err:
        raise Pi2Error(f"{path}: not UTF-8 text (byte {err.start})") from None
    except RecursionError:
        raise Pi2Error(f"{path}: JSON nested too deeply to be a run") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise Pi2Error(f"{path}: not usable JSON ({str(err)[:80]})") from None
    try:
        schema.validate(run)
    except schema.ResultSchemaError as err:
        raise schema.ResultSchemaError(f"{path}: {err}") from None
    schema.summarize(run)  # a stored summary is never trusted over the samples it came from
    return run
