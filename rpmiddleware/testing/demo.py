"""
C{twistd rpmiddleware --demo}: a simulated RPEngine connected in-process and
one scripted turn, so a newcomer sees replies flow without RPEngine.  With
C{--mailbox DIR} the simulated RPEngine talks through that folder, as
RPEngine's file transport does, instead of the WebSocket.

The demo's character plays the example quest-giver playbook
(C{docs/examples/quest-giver.toml}), so two more scripted lines follow the
first: the player asks about work (the stage moves to the offer, and the
C{give_quest} tool runs, which the demo answers as a game would) and takes
the job.

The demo's character is also the default character of the client endpoint
(unless the configuration names another), so an off-the-shelf voice client
that sends no C{character} message talks to it.
"""

from __future__ import annotations

import base64
from importlib import resources
from typing import Any

from twisted.application import service
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.builtin.playbook import IPlaybooks
from rpmiddleware.config.settings import Settings
from rpmiddleware.core.middleware import Middleware
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.plugin.clientext import START_TURN, TO_CLIENT, fromClient
from rpmiddleware.protocol.envelope import Envelope
from rpmiddleware.protocol.messages import OUTPUT_SAMPLE_RATE, textOfDelta
from rpmiddleware.testing.kit import exampleCard

DEMO_CHARACTER = "mira"
DEMO_LINE = "Good evening! Any news from the road?"
DEMO_PLAYBOOK = "data/quest-giver.toml"
#: The demo character's card (the bundled example, the one the demo's own
#: turns play).
DEMO_CARD = "data/example_character.json"
#: What the player says next when the character plays the demo playbook.
DEMO_SCRIPT = ("Do you have any work for me?", "Aye, I'll clear your cellar.")
#: The client id of the Python API's requests, which the demo makes.
DEMO_CLIENT = "api"
#: The example playbook's tools the game runs (the demo plays the game).
CLIENT_TOOLS = ("give_quest",)


def giveDemoPlaybook(settings: Settings) -> None:
    """
    The demo's character plays the example quest-giver playbook, unless the
    configuration gives it another.
    """
    table = settings.plugins.setdefault("playbook", {})
    characters = table.setdefault("characters", {})
    if isinstance(characters, dict):
        path = resources.files("rpmiddleware").joinpath(DEMO_PLAYBOOK)
        characters.setdefault(DEMO_CHARACTER, str(path))


def giveDemoCharacter(settings: Settings) -> None:
    """
    The demo's character is the default character, unless the configuration
    names one: a voice client that sends no C{character} message (an
    unmodified LLMRTC web client) then talks to Mira instead of being told
    to send one.
    """
    game = settings.game
    if game.default_character:
        return
    game.default_character = str(resources.files("rpmiddleware").joinpath(DEMO_CARD))
    game.default_character_id = DEMO_CHARACTER


class DemoService(service.Service):
    """
    Connects the simulator to our own listener and plays one turn.

    @ivar turn: the L{ReplyStream} of the scripted turn once it started.
    @ivar ready: fires with that stream's terminal envelope.
    """

    log = Logger()
    #: How the simulated RPEngine paces the reply: like a real one, so that a
    #: person watching the log sees it stream (tests make it faster).
    pacing: dict[str, Any] = {"tokensPerSecond": 25.0, "audioRealtime": True}
    port: int = 0

    def __init__(
        self,
        reactor: Any,
        middleware: Middleware,
        parent: service.MultiService,
        mailbox: bool = False,
    ) -> None:
        self.reactor = reactor
        #: Play through RPEngine's file mailbox instead of the WebSocket.
        self.mailbox = mailbox
        self.middleware = middleware
        self.parentService = parent
        self.engine: Any = None
        self.turn: ReplyStream | None = None
        self.ready: Deferred[Envelope] = Deferred()
        self._sentence = ""
        self._segment: Any = None
        self._audioSeconds = 0.0
        self._first: Envelope | None = None
        self._script: list[str] = []
        self._stopping = False
        self._unobserve: Any = None
        self.setName("demo")

    def startService(self) -> None:
        super().startService()
        from rpmiddleware.testing.simulator import SimulatorOptions, connectSimulator

        listener: Any = self.parentService.getServiceNamed("listener")
        port = self.port = listener.port.getHost().port
        self.middleware.registerCharacter(DEMO_CHARACTER, exampleCard())
        self._unobserve = self.middleware.router.observe(self._playbookEvent)
        options = SimulatorOptions(**self.pacing)
        if self.mailbox:
            from rpmiddleware.testing.simmailbox import connectMailboxSimulator

            folder: Any = self.parentService.getServiceNamed("mailbox")
            self.log.info(
                "demo: pointing a simulated RPEngine at the mailbox folder {folder}",
                folder=folder.root,
            )
            d = connectMailboxSimulator(self.reactor, folder.root, options)
        else:
            self.log.info("demo: connecting a simulated RPEngine to port {port}", port=port)
            d = connectSimulator(self.reactor, port, options)
        d.addCallback(self._connected)
        d.addErrback(self._failed)

    def _connected(self, engine: Any) -> None:
        self.engine = engine
        self.log.info(
            "demo: simulated RPEngine connected (session {sessionId}); the player says: {line!r}",
            sessionId=engine.sessionId,
            line=DEMO_LINE,
        )
        turn = self.turn = self._say(DEMO_LINE)
        turn.done.addBoth(self._finished)

    def _say(self, line: str, **fields: Any) -> ReplyStream:
        self._sentence, self._segment, self._audioSeconds = "", None, 0.0
        turn = self.middleware.requestReply(DEMO_CHARACTER, text=line, **fields)
        turn.subscribe(self._show)
        return turn

    def _show(self, envelope: Envelope) -> None:
        """
        Log the reply as it streams: each finished sentence of text, each
        audio segment as it starts, and the protocol's milestones.
        """
        kind = envelope.type
        if kind == "reply.text.delta":
            self._sentence += textOfDelta(envelope.fields)
            if self._sentence.rstrip().endswith((".", "!", "?")):
                self.log.info("demo: Mira says {text!r}", text=self._sentence.strip())
                self._sentence = ""
        elif kind == "reply.audio.chunk":
            segment = envelope.get("segmentSequence")
            self._audioSeconds += (
                len(base64.b64decode(envelope.get("data", "")))
                / 2
                / float(envelope.get("sampleRate") or OUTPUT_SAMPLE_RATE)
            )
            if segment != self._segment:
                self._segment = segment
                self.log.info("demo: speech for sentence {segment} begins", segment=segment)
        elif kind == "reply.audio.completed":
            self.log.info("demo: speech complete, {seconds:.1f} s", seconds=self._audioSeconds)
        else:
            self.log.info("demo: {type}", type=kind)

    def _finished(self, result: Any) -> Any:
        if isinstance(result, Envelope):
            assert self.turn is not None
            self.log.info(
                "demo: the turn is complete. Mira said: {text!r}. rpmiddleware keeps serving "
                "clients at ws://127.0.0.1:{port}/client/socket",
                text=self.turn.text(),
                port=self.port,
            )
            self._first = result
            if self._playbook() is not None:
                self._script = list(DEMO_SCRIPT)
                self._continue(None)
            else:
                self.ready.callback(result)
        else:
            self.log.failure("demo: the scripted turn failed", result)
            self.ready.errback(result)
        return None

    # The playbook part of the demo.

    def _playbook(self) -> Any:
        """
        The playbook plugin, if it is in the chain and gives Mira a playbook.
        """
        playbooks = self.middleware.plugin(IPlaybooks)
        if playbooks is not None and DEMO_CHARACTER in playbooks.playbooks:
            return playbooks
        return None

    def _continue(self, result: Any) -> None:
        if self._stopping:
            return
        if isinstance(result, Failure):
            self.log.failure("demo: a scripted turn failed", result)
            self.ready.errback(result)
            return
        if not self._script:
            state = self._playbook().state(DEMO_CLIENT) or {}
            self.log.info(
                "demo: the conversation is complete; the playbook is at stage {stage}",
                stage=state.get("stage"),
            )
            assert self._first is not None
            self.ready.callback(self._first)
            return
        line = self._script.pop(0)
        self.log.info("demo: the player says: {line!r}", line=line)
        self._say(line).done.addBoth(self._continue)

    def _playbookEvent(self, envelope: Envelope) -> None:
        """
        Show what the playbook tells the demo's client, and play the game's
        part in it: answer its client-run tool and start the turns it asks
        for (what a client endpoint does for a connection).
        """
        if envelope.get("clientId") != DEMO_CLIENT:
            return
        if envelope.type == START_TURN and not self._stopping:
            text = str(envelope.get("text") or "")
            self.log.info("demo: the playbook makes Mira speak up: {text!r}", text=text)
            extra = envelope.get("meta")
            meta = {"client": DEMO_CLIENT, **(extra if isinstance(extra, dict) else {})}
            turn = self._say(text, interactionMode="auto_event", meta=meta)
            turn.done.addErrback(lambda failure: None)
            return
        message = envelope.get("message") if envelope.type == TO_CLIENT else None
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "playbook-state":
            self.log.info(
                "demo: Mira plays the {playbook} playbook, stage {stage}",
                playbook=message.get("playbook"),
                stage=message.get("stage"),
            )
        elif kind == "stage-change":
            self.log.info(
                "demo: stage {old} -> {new} ({reason})",
                old=message.get("from"),
                new=message.get("to"),
                reason=message.get("reason"),
            )
        elif kind == "tool-call-start":
            arguments = message.get("arguments") or {}
            self.log.info(
                "demo: tool {name} called with {arguments}",
                name=message.get("name"),
                arguments=arguments,
            )
            if message.get("name") in CLIENT_TOOLS:
                # The demo is the game: it takes the quest and says so.
                result = {"questId": arguments.get("questId"), "status": "offered"}
                answer = {"type": "tool-result", "callId": message.get("callId"), "result": result}
                self.middleware.submit(fromClient(DEMO_CLIENT, answer))
        elif kind == "tool-call-end":
            self.log.info(
                "demo: tool call ended after {ms} ms: {outcome}",
                ms=message.get("durationMs"),
                outcome=message.get("error") or message.get("result"),
            )
        elif kind == "error":
            self.log.warn(
                "demo: {code}: {message}", code=message.get("code"), message=message.get("message")
            )

    def _failed(self, failure: Any) -> None:
        self.log.failure("demo: could not connect the simulated RPEngine", failure)
        if not self.ready.called:
            self.ready.errback(failure)

    def stopService(self) -> Any:
        super().stopService()
        self._stopping = True
        if self._unobserve is not None:
            self._unobserve()
        playbook = self._playbook()
        if playbook is not None:
            playbook.stop()
        if self.engine is not None:
            self.engine.disconnect()
        return None
