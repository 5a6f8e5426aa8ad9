"""The journal is checked before it is trusted, and watched while it is used.

At start (:func:`check_before_open`, :func:`check_opened`): a path that is a directory, a
directory the daemon can't write, a file that isn't an SQLite database (a text file, a garbage
header), one SQLite's ``quick_check`` finds damaged, or one a newer mcpl-router wrote (its
schema version above this one's) is refused with one line naming the file, what is wrong and
what to do (``mcpl-router run`` exits 2), never "repaired" by starting afresh or downgraded.

A journal that is gone, or empty, while its **marker** (``<journal>.state``, written beside it
once it holds messages, and at every clean stop) says it held messages is refused too: a lost
file must not become a silently empty start with every unacked wake gone. Removing the marker
is the operator's "start afresh, I know what is lost".

While running (:class:`FileIdentity`): the open file's identity (device, inode) is compared with
the path's at every commit; a file removed or replaced under the daemon makes the journal fail
its commits (nothing more is answered ``accepted``), ``/readyz`` says why, and the log says what
to do.

``mcpl-router journal check`` runs the start checks on a journal without starting a daemon;
docs/operations.md, *When the journal is damaged*, is the recovery path.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Final

import attrs

from mcpl_router.store.schema import SCHEMA_VERSION, JournalRefused

__all__ = ["FileIdentity", "check_before_open", "disk_is_full", "check_opened", "inspect_journal", "marker_path", "write_marker"]

SQLITE_HEADER: Final = b"SQLite format 3\x00"
RECOVER_FIX: Final = (
    "Stop here and keep the file: `mcpl-router journal check --config FILE` says what is wrong, and "
    "docs/operations.md (When the journal is damaged) how to salvage it into a new file."
)


def marker_path(path: Path) -> Path:
    return Path(f"{path}.state")


def _read_marker(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(marker_path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"lastSeq": None}
    return data if isinstance(data, dict) else {"lastSeq": None}


def write_marker(path: Path, last_seq: int) -> None:
    """Record that the journal at ``path`` holds messages up to ``last_seq`` (atomically:
    written beside it, then renamed over the old one). A failure to write it is not fatal
    (a full disk): the previous marker stands."""
    marker = marker_path(path)
    temporary = marker.with_name(marker.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"journal": str(path), "lastSeq": last_seq}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temporary, 0o600)
    os.replace(temporary, marker)


def check_before_open(path: Path) -> None:
    """Refuse a journal path that can't be what it should before SQLite touches it.

    Raises:
        JournalRefused: one line naming the file, what is wrong and what to do.
    """
    if path.is_dir():
        raise JournalRefused(path, "is a directory, not a journal file.", "Point journal.path at a file in it, e.g. journal.sqlite3.")
    directory = path.parent
    if directory.exists() and not os.access(directory, os.W_OK | os.X_OK):
        raise JournalRefused(
            path, f"its directory {directory} can't be written (read-only, or not ours).",
            "Make the directory writable by the daemon's user, or point journal.path elsewhere.",
        )
    marker = _read_marker(path)
    size = path.stat().st_size if path.exists() else None
    if marker is not None and (size is None or size == 0):
        held = marker.get("lastSeq")
        what = "is missing" if size is None else "is empty"
        raise JournalRefused(
            path,
            f"{what}, but {marker_path(path)} says it held messages"
            + (f" (up to seq {held})" if isinstance(held, int) else "")
            + ": starting afresh would lose every unacked one.",
            f"Restore the journal from a backup; or, to start afresh knowing what is lost, remove {marker_path(path)}.",
        )
    if size:
        try:
            with open(path, "rb") as handle:
                header = handle.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise JournalRefused(path, f"can't be read: {exc.strerror or exc}.", "Give the daemon's user read and write access to it.") from None
        if header != SQLITE_HEADER:
            raise JournalRefused(
                path, "is not an SQLite database (its header is not SQLite's: a text file, or garbage written over it).",
                "Point journal.path at the daemon's journal; if this was it, restore it from a backup (its messages can't be read).",
            )


def check_opened(db: sqlite3.Connection, path: Path) -> None:
    """Refuse an open journal that is damaged, or written by a newer mcpl-router.

    Raises:
        JournalRefused: one line naming the file, what is wrong and what to do.
    """
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise JournalRefused(
            path,
            f"was written by a newer mcpl-router (schema {version}; this one knows up to {SCHEMA_VERSION}) and is not downgraded.",
            "Run the newer mcpl-router on it, or restore a journal this version wrote.",
        )
    problems = [row[0] for row in db.execute("PRAGMA quick_check(5)").fetchall()]
    if problems != ["ok"]:
        raise JournalRefused(path, f"is damaged (SQLite quick_check: {'; '.join(problems)}).", RECOVER_FIX)


def refusal_of(path: Path, exc: BaseException) -> JournalRefused:
    """An SQLite or OS error at open, said as a refusal of the file."""
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc):
        return JournalRefused(path, "is not an SQLite database (or its first page is damaged).", RECOVER_FIX)
    if isinstance(exc, sqlite3.DatabaseError) and "malformed" in str(exc):
        return JournalRefused(path, f"is damaged ({exc}).", RECOVER_FIX)
    if isinstance(exc, sqlite3.OperationalError) and ("readonly" in str(exc) or "read-only" in str(exc)):
        return JournalRefused(path, f"can't be written ({exc}).", "Make it and its directory writable by the daemon's user.")
    if isinstance(exc, OSError):
        return JournalRefused(path, f"can't be opened: {exc.strerror or exc}.", "Check the path, its directory and their permissions.")
    return JournalRefused(path, f"can't be opened ({type(exc).__name__}: {exc}).", RECOVER_FIX)


@attrs.frozen
class FileIdentity:
    """The journal file as it was opened: a path now naming another file (or none) means the
    daemon's writes would go where no restart will read them."""

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        status = os.stat(path)
        return cls(path, status.st_dev, status.st_ino)

    def problem(self) -> str | None:
        """Why the path no longer names the open file, or None when it does."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return f"the journal file {self.path} was removed while the daemon had it open{_salvage(self.path)}"
        except OSError as exc:
            return f"the journal file {self.path} can't be checked: {exc.strerror or exc}"
        if (status.st_dev, status.st_ino) != (self.device, self.inode):
            return f"the journal file {self.path} was replaced by another file while the daemon had it open{_salvage(self.path)}"
        return None


def _salvage(path: Path) -> str:
    """How to copy the removed files back while the daemon still holds them open (Linux)."""
    commands = []
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            for suffix in ("", "-wal"):
                if target == f"{path}{suffix} (deleted)":
                    commands.append(f"cp /proc/{os.getpid()}/fd/{fd} {path}{suffix}.salvaged")
    except OSError:
        return ""
    if not commands:
        return ""
    return " (its data is still readable while the daemon runs: " + "; ".join(sorted(commands)) + ")"


def inspect_journal(path: Path) -> list[str]:
    """``mcpl-router journal check``: the start checks on ``path``, read-only (a running daemon
    may hold it), and what it holds.

    Raises:
        JournalRefused: what a start would refuse, said the same way.
    """
    check_before_open(path)
    if not path.exists():
        return [f"journal {path}: not there yet; the first start makes it."]
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise refusal_of(path, exc) from None
    try:
        check_opened(db, path)
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        events, last_seq = db.execute("SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM inbound").fetchone()
        unacked = db.execute("SELECT COUNT(*) FROM deliveries WHERE acked = 0").fetchone()[0]
        drafts = db.execute("SELECT COUNT(*) FROM drafts WHERE settled_at IS NULL").fetchone()[0]
    except sqlite3.Error as exc:
        raise refusal_of(path, exc) from None
    finally:
        db.close()
    marker = _read_marker(path)
    return [
        f"journal {path}: OK (SQLite quick_check ok, schema {version})",
        f"  events kept: {events}, last seq: {last_seq}; wakes not acked: {unacked}; live drafts: {drafts}",
        f"  marker {marker_path(path)}: " + ("none yet (written once the journal holds messages)" if marker is None else f"held messages up to seq {marker.get('lastSeq')}"),
    ]


#: Less free space than this on the journal's filesystem is a full disk (SQLite needs a few
#: pages for a commit, and its -shm file 32 KiB).
FULL_BELOW_BYTES: Final = 256 * 1024


def disk_is_full(path: Path) -> bool:
    """Whether the filesystem holding ``path`` has (almost) no room left."""
    try:
        status = os.statvfs(path.parent)
    except OSError:
        return False
    return status.f_bavail * status.f_frsize < FULL_BELOW_BYTES
