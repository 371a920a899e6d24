"""
The file mailbox as a C{twisted.application} service: the folder made ready
for RPEngine, and polled.

RPEngine's second transport (file transport v1, C{docs/file-transport-v1.md}
in its source) is a folder the player selects in RPEngine's settings. This
service creates it (C{manifest.json}, the two mailbox folders, the audio
slots), refuses one it cannot trust, and reads what RPEngine writes: every
50 ms while messages flow and every 250 ms when idle, as RPEngine itself
polls, with a L{LoopingCall} on the reactor thread (each poll reads at most
L{MailboxOptions.perPoll} files, so no poll is long).  Where Linux's inotify
is available a new C{.ready} marker also wakes it at once.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

from twisted.application import service
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from rpmiddleware.engine.mailbox.audioslots import DEFAULT_SLOT_COUNT, AudioLayout, createSlots
from rpmiddleware.engine.mailbox.endpoint import Folders, MailboxEndpoint
from rpmiddleware.engine.mailbox.files import (
    FROM_ENGINE,
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    MANIFEST_VERSION,
    READY,
    TO_ENGINE,
    MailboxError,
    Refused,
    checkDirectory,
    ensureDirectory,
    openDirectory,
    removePair,
    removeStale,
    removeTemporaries,
    scanReady,
    writeAtomic,
)

ACTIVE_INTERVAL = 0.05
IDLE_INTERVAL = 0.25


@dataclass
class MailboxOptions:
    path: str
    integrationId: str = "rpmiddleware"
    displayName: str = "rpmiddleware"
    slotCount: int = DEFAULT_SLOT_COUNT
    #: Also wake on inotify where the platform has it.
    watch: bool = True
    activeInterval: float = ACTIVE_INTERVAL
    idleInterval: float = IDLE_INTERVAL
    #: Seconds after a file is read or written that polling stays fast
    #: (RPEngine's own adapter: two seconds).
    activeFor: float = 2.0
    #: Files read per poll at most; more wait for the next.
    perPoll: int = 64
    #: Seconds between removals of mailbox files older than a day.
    staleEvery: float = 3600.0
    #: Seconds between removals of our expired acks and stale bookkeeping.
    tidyEvery: float = 1.0
    #: Offer a session at start-up to an RPEngine already polling the folder.
    adopt: bool = True


def manifest(options: MailboxOptions, layout: AudioLayout) -> dict[str, Any]:
    """
    The manifest RPEngine reads (its C{readManifest}: schema, version,
    integrationId, both mailbox folders, a mono WAV audio block).
    """
    return {
        "schema": MANIFEST_SCHEMA,
        "version": MANIFEST_VERSION,
        "integrationId": options.integrationId,
        "displayName": options.displayName,
        "mailboxes": {"integrationToEngine": TO_ENGINE, "engineToIntegration": FROM_ENGINE},
        "audio": layout.manifestBlock(),
    }


def prepareMailbox(options: MailboxOptions, layout: AudioLayout) -> Folders:
    """
    Make the mailbox folder ready for RPEngine: the folder and its three
    folders (yours alone), the manifest, the silent slot files.

    @raise MailboxError: the folder cannot be used, saying why.
    """
    root = os.path.abspath(os.path.expanduser(options.path))
    parent = os.path.dirname(root)
    if not os.path.isdir(parent):
        raise MailboxError(f"{parent}, where the mailbox folder {root} would go, is no folder")
    ensureDirectory(root, "mailbox folder")
    opened: list[int] = []
    try:
        rootFd = _open(root, "mailbox folder", opened)
        folders = []
        for name in (TO_ENGINE, FROM_ENGINE, layout.directory):
            path = os.path.join(root, name)
            ensureDirectory(path, f"mailbox's {name} folder")
            folders.append(_open(path, f"mailbox's {name} folder", opened))
        document = json.dumps(manifest(options, layout), indent=2) + "\n"
        writeAtomic(rootFd, MANIFEST_NAME, document.encode("utf-8"))
        createSlots(folders[2], layout)
    except (OSError, Refused, MailboxError) as e:
        for fd in opened:
            os.close(fd)
        if isinstance(e, MailboxError):
            raise
        why = e.reason if isinstance(e, Refused) else (e.strerror or str(e))
        raise MailboxError(f"cannot prepare the mailbox folder {root}: {why}")
    os.close(rootFd)
    return Folders(root, folders[0], folders[1], folders[2])


def _open(path: str, what: str, opened: list[int]) -> int:
    """
    A descriptor of the checked folder C{path}, and a second look through
    it, so that a folder swapped between the check and the opening is
    refused too.
    """
    fd = openDirectory(path)
    opened.append(fd)
    checked = checkDirectory(path, what)
    held = os.fstat(fd)
    if (held.st_dev, held.st_ino) != (checked.st_dev, checked.st_ino):
        raise MailboxError(f"the {what} {path} changed while it was being opened")
    return fd


class MailboxService(service.Service):
    """
    Serves RPEngine's file mailbox beside the WebSocket endpoint; both feed
    the middleware's one engine link.
    """

    log = Logger()
    name = "mailbox"

    def __init__(
        self,
        reactor: Any,
        middleware: Any,
        options: MailboxOptions,
        clock: IReactorTime | None = None,
    ) -> None:
        self.reactor = reactor
        self.middleware = middleware
        self.options = options
        self.clock: IReactorTime = clock if clock is not None else reactor
        self.layout = AudioLayout(slotCount=options.slotCount)
        self.folders: Folders | None = None
        self.endpoint: MailboxEndpoint | None = None
        self.polls = 0
        self._loop: LoopingCall | None = None
        self._notifier: Any = None
        self._wake: IDelayedCall | None = None
        self._flush: IDelayedCall | None = None
        self._polling = False
        self._closeAfterPoll = False
        self._failing = False
        self._lastActivity = -1e9
        self._lastStale = 0.0
        self._lastTidy = 0.0

    @property
    def root(self) -> str:
        return os.path.abspath(os.path.expanduser(self.options.path))

    def prepare(self) -> None:
        if self.folders is None:
            try:
                self.folders = prepareMailbox(self.options, self.layout)
            except MailboxError as e:
                raise SystemExit(f"rpmiddleware: cannot use the RPEngine mailbox: {e}")

    def privilegedStartService(self) -> None:
        # Before twistd detaches, so a refused folder is said at the terminal.
        self.prepare()
        super().privilegedStartService()

    def startService(self) -> None:
        self.prepare()
        super().startService()
        folders = self.folders
        assert folders is not None
        now = self.clock.seconds()
        for fd in (folders.toEngine, folders.fromEngine):
            removeTemporaries(fd)
            removeStale(fd, time.time())
        self._lastStale = self._lastTidy = now
        endpoint = self.endpoint = MailboxEndpoint(
            self.middleware, self.clock, folders, self.layout, onWrite=self._wrote
        )
        found, removed = endpoint.outbox.recover()
        if found or removed:
            self.log.info(
                "mailbox: {found} of our messages RPEngine has not acknowledged were found "
                "again; {removed} old or broken files removed",
                found=found,
                removed=removed,
            )
        self._loop = LoopingCall(self._poll)
        self._loop.clock = self.clock
        self._loop.start(self.options.activeInterval, now=True)
        if self.options.watch:
            self._watch(os.path.join(folders.root, FROM_ENGINE))
        endpoint.start(adopt=self.options.adopt)
        self.log.info(
            "RPEngine's file mailbox is ready in {folder}: in RPEngine open Settings, set Game "
            "transport to Filesystem mailbox, press Choose mailbox folder and select this "
            "folder ({slots} audio slots, {wake})",
            folder=folders.root,
            slots=self.layout.slotCount,
            wake="woken by inotify" if self._notifier is not None else "polled",
        )

    def stopService(self) -> Any:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._wake is not None and self._wake.active():
            self._wake.cancel()
        self._wake = None
        if self._notifier is not None:
            self._notifier.loseConnection()
            self._notifier = None
        if self._flush is not None and self._flush.active():
            self._flush.cancel()
        self._flush = None
        if self.endpoint is not None:
            self.endpoint.stop()
            if self.folders is not None and not self._polling:
                self.endpoint.outbox.flush()
        if self._polling:
            # Stopped from inside a poll (something the poll handed on ended
            # the program): the poll closes the folders when it is done.
            self._closeAfterPoll = True
        else:
            self._closeFolders()
        return None

    def _closeFolders(self) -> None:
        folders, self.folders = self.folders, None
        if folders is not None:
            for fd in (folders.toEngine, folders.fromEngine, folders.audio):
                os.close(fd)

    # Polling

    def _poll(self) -> None:
        endpoint, folders = self.endpoint, self.folders
        if endpoint is None or folders is None or self._polling:
            return
        self._polling = True
        endpoint.outbox.holdAcks()
        try:
            self.polls += 1
            scan = scanReady(folders.fromEngine, self.options.perPoll)
            for name in scan.strangers:
                endpoint.stranger(name)
                removePair(folders.fromEngine, name[: -len(READY)])
            for stem in scan.stems:
                if not self.running:
                    break
                try:
                    endpoint.read(stem)
                except Exception:
                    self.log.failure("mailbox: reading {stem} failed", stem=stem)
                removePair(folders.fromEngine, stem)
            now = self.clock.seconds()
            if scan.stems:
                self._lastActivity = now
            endpoint.watchReader()
            if now - self._lastTidy >= self.options.tidyEvery:
                self._lastTidy = now
                endpoint.maintain()
            if now - self._lastStale >= self.options.staleEvery:
                self._lastStale = now
                for fd in (folders.toEngine, folders.fromEngine):
                    removeStale(fd, time.time())
            self._pace(now, backlog=scan.total > len(scan.stems))
            self._failing = False
        except OSError as e:
            if not self._failing:
                self._failing = True
                self.log.error(
                    "mailbox: cannot read {folder}: {error}", folder=folders.root, error=e
                )
        finally:
            self._polling = False
            if self._closeAfterPoll:
                self._closeAfterPoll = False
                endpoint.outbox.flush()
                self._closeFolders()
            elif self._flush is None:
                # In the next reactor turn: what this poll handed on is
                # written to its clients first, not after the acks' trips to
                # the disk.
                self._flush = self.clock.callLater(0, self._flushAcks)

    def _flushAcks(self) -> None:
        self._flush = None
        if self.endpoint is not None and self.folders is not None:
            self.endpoint.outbox.flush()

    def _pace(self, now: float, backlog: bool = False) -> None:
        """
        Fast while RPEngine is talking (or we are), slow when idle.
        """
        loop = self._loop
        if loop is None:
            return
        active = backlog or now - self._lastActivity < self.options.activeFor
        loop.interval = self.options.activeInterval if active else self.options.idleInterval

    def _wrote(self) -> None:
        """
        We wrote into the mailbox: an answer is due soon, so poll fast from
        now rather than after the rest of an idle interval.
        """
        self._lastActivity = self.clock.seconds()
        loop = self._loop
        if loop is None or not loop.running or self._polling:
            return
        if loop.interval != self.options.activeInterval:
            loop.interval = self.options.activeInterval
            loop.reset()

    # inotify

    def _watch(self, path: str) -> None:
        try:
            from twisted.internet import inotify
            from twisted.python.filepath import FilePath

            notifier = inotify.INotify(reactor=self.reactor)
            notifier.startReading()
            notifier.watch(
                FilePath(path),
                mask=inotify.IN_MOVED_TO | inotify.IN_CREATE | inotify.IN_CLOSE_WRITE,
                callbacks=[self._notified],
            )
        except Exception as e:
            self.log.info("mailbox: no inotify here ({error}); polling only", error=str(e))
            return
        self._notifier = notifier

    def _notified(self, watch: Any, path: Any, mask: int) -> None:
        name = path.basename()
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        if name.endswith(READY) and self._wake is None:
            self._wake = self.clock.callLater(0, self._woken)

    def _woken(self) -> None:
        self._wake = None
        self._lastActivity = self.clock.seconds()
        self._poll()
        loop = self._loop
        if loop is not None and loop.running and not self._polling:
            loop.reset()
