"""
One client's turns: one plays at a time.

A new turn while one plays cancels it first (barge-in), or, with barge-in
off, waits behind it; at most C{client.queued_turns} wait, and more are
refused with RATE_LIMITED.  A turn is started here: the request RPEngine is
asked (the character, its card, the output the client configured, the
prompt fields), the speech output it plays on (the WebRTC track when one is
negotiated), and the L{Turn} that turns its reply stream into client
messages.  When it ends, the session remembers what was said, and the next
waiting turn starts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from rpmiddleware.client.attachments import attachmentContext
from rpmiddleware.client.capacity import CapacityMonitor
from rpmiddleware.client.sessions import ClientConfig
from rpmiddleware.client.settings import Character
from rpmiddleware.client.surface import ClientSurface, Opener
from rpmiddleware.client.tts import SpeechOutput
from rpmiddleware.client.turns import AUDIO, Turn
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.plugin.clientext import turnPlayed
from rpmiddleware.protocol.clienterrors import INTERNAL_ERROR, RATE_LIMITED


class TurnQueue:
    """
    @param client: the connection whose turns these are.
    @param clock: the turns' timeouts run on it.
    @param capacity: tells a client whose turn waits for RPEngine why.

    @ivar current: the turn playing now, if any.
    @ivar waiting: the turns waiting behind it, each a callable that starts it.
    """

    log = Logger()

    def __init__(
        self, client: ClientSurface, clock: IReactorTime, capacity: CapacityMonitor
    ) -> None:
        self._client = client
        self._clock = clock
        self._capacity = capacity
        self.current: Turn | None = None
        self.waiting: deque[Callable[[], None]] = deque()
        #: The turn started last, kept once it ended until the next starts:
        #: what a late C{played} is about (L{endedTurnPlayed}).
        self.latest: Turn | None = None

    def submit(
        self,
        kind: str,
        playerText: str | None,
        open: Opener,
        config: ClientConfig | None = None,
        played: Mapping[str, Any] | None = None,
    ) -> None:
        """
        L{rpmiddleware.client.surface.ClientSurface.submit}, with barge-in or
        queueing as configured.  C{config} is the configuration the turn
        plays with (the session's now when not given); C{played}, the
        client's report of how much of the playing turn's speech it played
        (L{rpmiddleware.client.messages.played}), goes with a barge-in's
        cancel.
        """
        client = self._client
        character = client.character()
        config = config or client.session.config
        turn = self.current
        if turn is not None and not turn.ended:
            if client.session.config.bargesIn(client.settings):
                self.dropWaiting("a waiting turn was replaced by a newer one (barge-in)")
                self.current = None
                turn.cancel("interrupted by a new turn (barge-in)", played)
            elif len(self.waiting) >= client.settings.queued_turns:
                client.error(
                    RATE_LIMITED,
                    f"{len(self.waiting)} turns already wait behind the one playing; "
                    "wait for reply-complete or send cancel",
                    retryable=True,
                )
                return
            else:
                self.waiting.append(lambda: self._start(kind, playerText, open, character, config))
                return
        elif client.session.config.bargesIn(client.settings):
            # It barges in on a reply that completed upstream but still
            # plays: the WebRTC track falls silent, and the plugins hear how
            # far it played (the track's count, else the client's), before
            # this turn's request.
            if not self.stopTrack("interrupted by a new turn (barge-in)") and played is not None:
                self.endedTurnPlayed(played)
        self._start(kind, playerText, open, character, config)

    def endedTurnPlayed(
        self, played: Mapping[str, Any] | None = None, turnId: str | None = None
    ) -> bool:
        """
        The most recent turn (no newer one started) completed upstream
        while its speech still played, and the player cut it off: send the
        plugins how much of it was played
        (L{TURN_PLAYED <rpmiddleware.plugin.clientext.TURN_PLAYED>}), in
        order with this client's turns, so the memory plugin amends the
        reply it remembered whole before the next request is planned.
        C{played}: the client's report (L{rpmiddleware.client.messages.played}),
        else what the speech output knows it played (the WebRTC track).
        C{turnId}, when given, must name that turn.  Told once a turn;
        whether it was told.
        """
        turn = self.latest
        if turn is None or not turn.ended or (turnId is not None and turnId != turn.id):
            return False
        amount = turn.playedAfterEnd(played)
        if amount is None:
            return False
        self.latest = None
        client = self._client
        self.log.info(
            "client {peer}: turn {turnId} was cut off after it completed, "
            "{samples} samples at {rate} Hz played",
            peer=client.peer,
            turnId=turn.id,
            samples=amount["samples"],
            rate=amount["sampleRate"],
        )
        client.middleware.submit(turnPlayed(client.session.id, turn.id, amount))
        return True

    def stopTrack(self, reason: str, turnId: str | None = None) -> bool:
        """
        The client's WebRTC speech track still plays a turn that completed
        upstream (C{turnId}, when given): silence it now, the plugins told
        how much it played (L{rpmiddleware.webrtc.voice.VoiceLink.stopSpeech}).
        Whether it did.
        """
        voice = self._client.voice
        return voice is not None and bool(voice.stopSpeech(reason, turnId))

    def submitAudio(
        self,
        audio: dict[str, Any],
        config: ClientConfig | None = None,
        played: Mapping[str, Any] | None = None,
    ) -> None:
        """
        Start a turn from a recording already in RPEngine's C{event.audio}
        shape (PCM at any rate; the audio-resample plugin converts it), with
        any pending attachments' alt text as context.  The entry point for
        audio that arrives other than in an C{audio} message (a WebRTC
        microphone track).

        @raise InvalidMessage: when the client has no character.
        """
        client = self._client
        context = attachmentContext(client)

        def open(request: dict[str, Any]) -> ReplyStream:
            return client.middleware.requestReply(text=context, audio=audio, **request)

        self.submit(AUDIO, None, open, config, played)

    def dropWaiting(self, reason: str) -> None:
        """
        Forget the turns waiting behind the one playing, telling the client
        of each (they have no turnId yet).
        """
        while self.waiting:
            self.waiting.popleft()
            self._client.send({"type": "tts-cancelled", "reason": reason})

    def cancelCurrent(self, reason: str) -> None:
        """
        Cancel the turn playing, if any; the next waiting one then starts.
        """
        if self.current is not None:
            self.current.cancel(reason)

    def stop(self, reason: str) -> None:
        """
        Forget the waiting turns without a word, and cancel the one playing
        (the connection is going, or plays another session now).
        """
        self.waiting.clear()
        self.latest = None
        turn, self.current = self.current, None
        if turn is not None and not turn.ended:
            turn.cancel(reason)

    def _start(
        self,
        kind: str,
        playerText: str | None,
        open: Opener,
        character: Character,
        config: ClientConfig,
    ) -> None:
        client = self._client
        if client.closed:
            return
        settings = client.settings
        # With a WebRTC speech track negotiated, the reply plays on it.
        track = client.voice.speechOutput() if client.voice and config.wantsAudio() else None
        rate = track.rate if track is not None else config.outputRate(settings)
        request: dict[str, Any] = {
            "characterId": character.characterId,
            "card": character.card,
            "integrationId": character.integrationId,
            "output": config.output(settings),
            "player": config.player,
            "meta": {
                "client": client.session.id,
                "outputSampleRate": rate,
                **config.pluginMeta(),
            },
            # The turn forwards each chunk as it comes; keeping them all on the
            # stream too would hold a whole reply's audio per client.
            "retainAudio": False,
            "retainText": False,
            **config.promptFields(),
        }
        speech = track or (
            SpeechOutput(rate, config.streams(settings)) if config.wantsAudio() else None
        )
        try:
            stream = open(request)
        except Exception:
            self.log.failure("starting a turn for client {peer} failed", peer=client.peer)
            client.error(INTERNAL_ERROR, "the middleware could not start this turn")
            self._startWaiting()
            return
        turn = Turn(
            kind,
            stream,
            client.send,
            speech,
            self._clock,
            settings.accept_timeout,
            self._ended,
            playerText,
            stallTimeout=settings.stall_timeout,
            queue=client.middleware.engineQueue,
        )
        self.current = self.latest = turn
        self.log.info(
            "client {peer} started a {kind} turn {turnId}",
            peer=client.peer,
            kind=kind,
            turnId=turn.id,
            sessionId=client.session.id,
        )
        turn.start()
        if not turn.ended and not client.middleware.engineConnected:
            client.send(self._capacity.message(client.port, note="Your turn waits for RPEngine."))

    def _ended(self, turn: Turn) -> None:
        session = self._client.session
        details = {"turnId": turn.id, "source": turn.kind}
        session.remember("player", turn.transcript or "", **details)
        for line in turn.lines or [{"text": turn.replyText}]:
            if line["text"]:
                speaker = {"speaker": line["speaker"]} if "speaker" in line else {}
                session.remember(
                    "character", line["text"], outcome=turn.outcome, **details, **speaker
                )
        if self.current is turn:
            self.current = None
            self._startWaiting()

    def _startWaiting(self) -> None:
        if self.waiting and self.current is None and not self._client.closed:
            self.waiting.popleft()()
