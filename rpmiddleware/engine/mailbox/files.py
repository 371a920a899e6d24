"""
RPEngine's file mailbox (file transport v1) as files: folder checks, stems,
atomic writes, bounded scans, removal and clean-up.

Nothing here knows the protocol; L{rpmiddleware.engine.mailbox.service} does.
The facts follow RPEngine's public source: C{docs/file-transport-v1.md} and
C{src/filesystem-mailbox-adapter.ts} (its reader and writer), and its own
game side, C{tools/mock-game/server.mjs}.  Every envelope is one immutable
C{<13-digit ms timestamp>-<messageId>.json} and a C{.ready} marker made only
once the JSON is complete; readers look only at C{.ready} names, in name
order.

RPEngine's reader is strict in a way that makes our writer's care matter: a
C{.ready} whose JSON is missing or half-written stops its poll at that name,
every poll, for good.  So a JSON file is written under a temporary name,
flushed to disk and renamed, and only then is the marker made the same way;
a process killed at any point leaves either nothing RPEngine reads or a
whole envelope.  Removal goes the other way: marker first, then the JSON.

All file operations go through directory descriptors opened once with
C{O_NOFOLLOW}, and every file is opened with C{O_NOFOLLOW}: a symbolic link
planted in a mailbox folder is refused, never followed.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from rpmiddleware.protocol.messages import MAX_MESSAGE_BYTES

#: The manifest RPEngine reads in the folder the player selects.
MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA = "gemtavern.rp_engine.file_transport"
MANIFEST_VERSION = 1
#: The two mailbox folders, named as RPEngine's own game side names them.
TO_ENGINE = "integration-to-engine"
FROM_ENGINE = "engine-to-integration"
READY = ".ready"
JSON = ".json"
#: RPEngine and its mock game refuse a message over 8 MiB.
MAX_ENVELOPE_BYTES = MAX_MESSAGE_BYTES
#: Mailbox files older than this are removed (docs/file-transport-v1.md).
STALE_SECONDS = 24 * 60 * 60
#: Our temporary names: never a stem, never C{.ready}, so no reader looks.
TEMP_PREFIX = ".rpmiddleware-"
TEMP_SUFFIX = ".tmp"
DIRECTORY_MODE = 0o700
FILE_MODE = 0o600

#: C{<13 digits>-<messageId>}: RPEngine's stems (C{nextStem}); messageIds
#: are UUIDs (RPEngine) or 32 hex digits (ours); anything outside this
#: alphabet is no stem and could be a path trick.
_STEM = re.compile(r"\A([0-9]{13})-([A-Za-z0-9][A-Za-z0-9_-]{0,127})\Z")

_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class MailboxError(Exception):
    """
    The mailbox folder cannot be used; the message says why, for a person.
    """


class Refused(Exception):
    """
    One mailbox file was refused; C{reason} says why, for the log.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parseStem(stem: str) -> tuple[int, str] | None:
    """
    The millisecond timestamp and messageId of a stem, or C{None} for a name
    that is not one.
    """
    match = _STEM.match(stem)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)


def makeStem(milliseconds: int, messageId: str) -> str:
    stem = f"{milliseconds:013d}-{messageId}"
    if parseStem(stem) is None:
        raise ValueError(f"{messageId[:64]!r} cannot name a mailbox file")
    return stem


class StemClock:
    """
    Stems that sort in the order they were made: the wall clock in
    milliseconds, or one more than the last, as RPEngine's C{nextStem} does,
    so two envelopes written in the same millisecond keep their order.
    """

    def __init__(self, last: int = 0, now: object = None) -> None:
        self.last = last
        self._now = now if callable(now) else time.time

    def next(self, messageId: str) -> str:
        self.last = max(int(self._now() * 1000), self.last + 1)
        return makeStem(self.last, messageId)


def checkDirectory(path: str, what: str) -> os.stat_result:
    """
    Refuse a folder we must not trust: a symbolic link, not a folder, owned
    by another user, or writable by every user (anyone on the machine could
    then plant or swap envelopes and audio).

    @raise MailboxError: saying which and why.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise MailboxError(f"the {what} {path} does not exist")
    except OSError as e:
        raise MailboxError(f"cannot inspect the {what} {path}: {e.strerror}")
    if stat.S_ISLNK(info.st_mode):
        raise MailboxError(
            f"the {what} {path} is a symbolic link (to {os.path.realpath(path)}); give the "
            "real folder, so that nobody can point the mailbox elsewhere by changing the link"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise MailboxError(f"the {what} {path} is not a folder")
    if info.st_uid != os.geteuid():
        raise MailboxError(
            f"the {what} {path} belongs to user {info.st_uid}, not to the user running "
            "rpmiddleware; use a folder of your own"
        )
    if info.st_mode & stat.S_IWOTH:
        raise MailboxError(
            f"the {what} {path} is writable by every user on this machine (mode "
            f"{stat.S_IMODE(info.st_mode):o}), so anyone could plant or change messages and "
            f"audio in it; run chmod o-w {path} or use a folder only you can write"
        )
    return info


def ensureDirectory(path: str, what: str) -> None:
    """
    Make C{path} (only you may enter it) unless it exists, then check it.
    """
    try:
        os.mkdir(path, DIRECTORY_MODE)
    except FileExistsError:
        pass
    except OSError as e:
        raise MailboxError(f"cannot create the {what} {path}: {e.strerror}")
    checkDirectory(path, what)


def openDirectory(path: str) -> int:
    """
    A descriptor of the folder C{path} itself (never through a link), which
    keeps naming the same folder whatever later happens to the path.
    """
    return os.open(path, _OPEN_DIRECTORY)


def _writeAll(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def writeAtomic(
    directory: int, name: str, data: bytes, mode: int = FILE_MODE, durable: bool = True
) -> None:
    """
    Put C{data} at C{name} in the folder C{directory} (a descriptor) so that
    any reader sees the old file, no file, or all of C{data}: written to a
    temporary name, flushed to the disk (unless C{durable} is false: an
    empty marker has nothing to flush), renamed over C{name}.
    """
    temporary = f"{TEMP_PREFIX}{uuid.uuid4().hex}{TEMP_SUFFIX}"
    fd = os.open(temporary, _OPEN_NEW, mode, dir_fd=directory)
    try:
        try:
            _writeAll(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        _unlink(directory, temporary)
        raise


def writeEnvelopes(directory: int, envelopes: list[tuple[str, bytes]]) -> None:
    """
    Publish envelopes (stem, JSON): every JSON made durable under its name
    first, the folder flushed once, then their C{.ready} markers in the same
    order.  So even after a power cut no marker names a JSON that is not
    there whole; a marker lost in one only leaves its envelope unpublished,
    which the session writes again when no ack comes.
    """
    for stem, payload in envelopes:
        writeAtomic(directory, stem + JSON, payload)
    os.fsync(directory)
    for stem, _ in envelopes:
        writeAtomic(directory, stem + READY, b"", durable=False)


def writeEnvelope(directory: int, stem: str, payload: bytes) -> None:
    """
    Publish one envelope (see L{writeEnvelopes}).
    """
    writeEnvelopes(directory, [(stem, payload)])


def _unlink(directory: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=directory)
    except FileNotFoundError:
        return False
    return True


def removePair(directory: int, stem: str) -> None:
    """
    Remove an envelope: the marker first, so no reader ever finds a marker
    without its JSON; a JSON without a marker is ignored by every reader.
    """
    _unlink(directory, stem + READY)
    _unlink(directory, stem + JSON)


def exists(directory: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


@dataclass
class Scan:
    """
    One look at a mailbox folder: the first C{.ready} stems in name order
    (at most the limit asked for), and the marker names that are no stem.
    """

    stems: list[str]
    strangers: list[str]
    total: int


def scanReady(directory: int, limit: int) -> Scan:
    """
    The C{.ready} stems of a folder in name order, at most C{limit} of them,
    so that one poll's work is bounded however full the folder is.
    """
    stems: list[str] = []
    strangers: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name
            if not name.endswith(READY):
                continue
            stem = name[: -len(READY)]
            if parseStem(stem) is None:
                strangers.append(name)
            else:
                stems.append(stem)
    stems.sort()
    return Scan(stems[:limit], strangers, len(stems))


def readEnvelopeBytes(directory: int, stem: str, limit: int = MAX_ENVELOPE_BYTES) -> bytes:
    """
    The JSON of a ready envelope.

    @raise Refused: the marker or the JSON is a link or no regular file, the
        JSON is missing or larger than C{limit}.
    """
    try:
        marker = os.stat(stem + READY, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        raise Refused("its .ready marker vanished")
    if not stat.S_ISREG(marker.st_mode):
        raise Refused("its .ready marker is a symbolic link or not a regular file")
    try:
        fd = os.open(stem + JSON, _OPEN_READ, dir_fd=directory)
    except FileNotFoundError:
        raise Refused("a .ready marker without its JSON file")
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused("its JSON file is a symbolic link")
        raise Refused(f"its JSON file cannot be opened: {e.strerror}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused("its JSON file is not a regular file")
        if info.st_size > limit:
            raise Refused(
                f"it is {info.st_size} bytes; RPEngine's messages are at most {limit} bytes"
            )
        return _readUpTo(fd, limit)
    finally:
        os.close(fd)


def _readUpTo(fd: int, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        part = os.read(fd, min(1 << 20, limit + 1 - size))
        if not part:
            return b"".join(parts)
        parts.append(part)
        size += len(part)
        if size > limit:
            raise Refused(f"it grew past {limit} bytes while being read")


def readRegularFile(directory: int, name: str, limit: int) -> bytes:
    """
    A regular file of C{directory} (never through a link), at most C{limit}
    bytes.

    @raise Refused: saying why not.
    """
    try:
        fd = os.open(name, _OPEN_READ, dir_fd=directory)
    except FileNotFoundError:
        raise Refused(f"{name} does not exist")
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(f"{name} is a symbolic link")
        raise Refused(f"{name} cannot be opened: {e.strerror}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{name} is not a regular file")
        if info.st_size > limit:
            raise Refused(f"{name} is {info.st_size} bytes, more than {limit}")
        return _readUpTo(fd, limit)
    finally:
        os.close(fd)


def _staleNames(directory: int, before: float) -> Iterator[str]:
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(info.st_mode):
                continue
            if info.st_mtime < before:
                yield entry.name


def removeStale(directory: int, now: float, maxAge: float = STALE_SECONDS) -> int:
    """
    Remove every file older than C{maxAge} seconds (links included, never
    what they point at), each marker before its JSON.
    """

    def order(name: str) -> tuple[str, int]:
        if name.endswith(READY):
            return name[: -len(READY)], 0
        if name.endswith(JSON):
            return name[: -len(JSON)], 1
        return name, 2

    removed = 0
    for name in sorted(_staleNames(directory, now - maxAge), key=order):
        if _unlink(directory, name):
            removed += 1
    return removed


def removeTemporaries(directory: int) -> int:
    """
    Remove our own temporary files: left only by a process killed mid-write,
    and never read by anyone.
    """
    removed = 0
    with os.scandir(directory) as entries:
        names = [
            e.name
            for e in entries
            if e.name.startswith(TEMP_PREFIX) and e.name.endswith(TEMP_SUFFIX)
        ]
    for name in names:
        if _unlink(directory, name):
            removed += 1
    return removed
