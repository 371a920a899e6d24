"""
Stopping the real daemon: C{twistd -n rpmiddleware} in a child process, sent
SIGTERM, closes its plugins, and the memory store is left whole in its main
file (issue 34).
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import sys
from typing import Any

from twisted.internet import protocol, reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase

from rpmiddleware.testing.kit import exampleCard
from rpmiddleware.testing.live import connectClient
from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTENING = re.compile(rb"listening on ws://127\.0\.0\.1:(\d+)/rp-engine/socket")


class Daemon(protocol.ProcessProtocol):
    """
    The child's output, the port it listens on, and its end.
    """

    def __init__(self) -> None:
        self.output = b""
        self.listening: Deferred[int] = Deferred()
        self.ended: Deferred[Any] = Deferred()

    def outReceived(self, data: bytes) -> None:
        self.output += data
        found = LISTENING.search(self.output)
        if found is not None and not self.listening.called:
            self.listening.callback(int(found.group(1)))

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        if not self.listening.called:
            self.listening.errback(AssertionError(self.output.decode(errors="replace")[-3000:]))
        self.ended.callback(reason.value)


class StopTests(TestCase):
    timeout = 60

    async def _remember(self, port: int) -> None:
        """
        With RPEngine's simulator connected, a game plays a turn on a saved
        conversation, pins a fact to it and adds world knowledge, through
        the client protocol: all are written to the database (a pin is
        answered once written, after the turn's write).
        """
        engine = await connectSimulator(
            reactor, port, SimulatorOptions(tokensPerSecond=None, audioRealtime=False)
        )
        client = connectClient(reactor, f"ws://127.0.0.1:{port}/client/socket")
        await client.opened
        client.send({"type": "character", "characterId": "mira", "card": exampleCard()})
        client.send({"type": "memory", "op": "use", "id": "0", "conversationId": "save-1"})
        answer = await client.nextOfType("memory-result", "error")
        self.assertEqual(answer["type"], "memory-result", answer)
        client.send({"type": "text", "text": "Remember the lantern."})
        done = await client.nextOfType("reply-complete", "error")
        self.assertEqual(done["type"], "reply-complete", done)
        messages = [
            {"type": "memory", "op": "pin", "id": "1", "characterId": "mira",
             "conversationId": "save-1", "fact": "The player is Alex."},
            {"type": "memory", "op": "know", "id": "2", "text": "The mill burned down.",
             "constant": True},
        ]  # fmt: skip
        for message in messages:
            client.send(message)
            answer = await client.nextOfType("memory-result", "error")
            self.assertEqual(answer["type"], "memory-result", answer)
        client.drop()
        engine.disconnect()
        await engine.closed

    async def _stopWith(self, folder: str, signal: str) -> bytes:
        config = os.path.join(folder, "rpmiddleware.toml")
        with open(config, "w") as f:
            f.write('[plugins.memory]\npath = "memory.sqlite3"\n')
        daemon = Daemon()
        args = [
            sys.executable, "-c", "from twisted.scripts.twistd import run; run()",
            "-n", "--pidfile=", "--logfile=-", "rpmiddleware", "--config", config, "--port", "0",
        ]  # fmt: skip
        process = reactor.spawnProcess(  # type: ignore[attr-defined]
            daemon, sys.executable, args, env=dict(os.environ), path=folder
        )
        try:
            port = await daemon.listening
            await self._remember(port)
        except BaseException:
            if process.pid is not None:
                process.signalProcess("KILL")
            await daemon.ended
            raise
        process.signalProcess(signal)
        await daemon.ended
        return daemon.output

    async def _test(self) -> None:
        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        output = await self._stopWith(folder, "TERM")
        self.assertNotIn(b"Traceback", output)
        self.assertIn(b"Server Shut Down", output)
        path = os.path.join(folder, "memory.sqlite3")
        wal = path + "-wal"
        self.assertTrue(
            not os.path.exists(wal) or os.path.getsize(wal) == 0,
            f"{wal} holds {os.path.getsize(wal) if os.path.exists(wal) else 0} bytes",
        )
        # The main file alone, without its -wal and -shm, is the whole store.
        alone = os.path.join(self.mktemp() + "-copy.sqlite3")
        shutil.copyfile(path, alone)
        db = sqlite3.connect(alone)
        try:
            self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
            self.assertLessEqual({"conversations", "entries", "facts", "knowledge"}, tables)
            self.assertEqual(
                db.execute("SELECT text FROM facts").fetchall(), [("The player is Alex.",)]
            )
            self.assertEqual(db.execute("SELECT count(*) FROM knowledge").fetchone()[0], 1)
            self._holdsTheTurn(db)
        finally:
            db.close()

    def _holdsTheTurn(self, db: sqlite3.Connection) -> None:
        rows = db.execute("SELECT role, text FROM entries ORDER BY seq").fetchall()
        self.assertEqual([role for role, _ in rows], ["player", "character"], rows)
        self.assertEqual(rows[0][1], "Remember the lantern.")

    async def _testKill(self) -> None:
        folder = os.path.abspath(self.mktemp())
        os.makedirs(folder)
        await self._stopWith(folder, "KILL")
        path = os.path.join(folder, "memory.sqlite3")
        # The main file and its -wal, copied as a pair (the -shm is not needed).
        copy = os.path.abspath(self.mktemp() + "-copy.sqlite3")
        shutil.copyfile(path, copy)
        if os.path.exists(path + "-wal"):
            shutil.copyfile(path + "-wal", copy + "-wal")
        db = sqlite3.connect(copy)
        try:
            self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
            self.assertEqual(
                db.execute("SELECT text FROM facts").fetchall(), [("The player is Alex.",)]
            )
            self._holdsTheTurn(db)
        finally:
            db.close()

    def test_killLeavesEveryCompletedTurnInTheFileAndItsLog(self) -> Deferred[None]:
        """
        The same daemon killed with SIGKILL after a completed turn: its main
        file and C{-wal}, opened by SQLite, hold the turn and the fact.
        """
        return Deferred.fromCoroutine(self._testKill())

    def test_sigtermLeavesTheMemoryStoreWhole(self) -> Deferred[None]:
        """
        C{twistd -n rpmiddleware} with memory in a folder, given a fact and
        some knowledge by a game, then sent SIGTERM: it exits cleanly, no
        C{-wal} file holds anything, and the main file alone (copied without
        C{-wal} and C{-shm}) passes SQLite's integrity check and has the
        memory tables with what was written: the completed turn, the fact
        and the knowledge.
        """
        return Deferred.fromCoroutine(self._test())
