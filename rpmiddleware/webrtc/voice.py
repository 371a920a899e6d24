"""
One client's WebRTC, joined to its client-endpoint connection.

L{VoiceLink} is the adapter between a L{Peer} and the endpoint's
C{ClientConnection}; it touches the connection only through the few
members listed in L{ClientHost}:

  - C{offer} -> C{signal} with the answer, or C{error} with the seed's code;
  - every payload message the connection sends also goes on the data
    channel (L{VoiceLink.mirror}; the signalling ones, C{ready},
    C{signal}, C{pong} and C{reconnect-ack}, stay on the WebSocket);
  - what the client sends on the data channel is handled exactly like a
    WebSocket message (C{connection.received}), except that a C{ping} there
    is answered with C{pong} there;
  - the microphone goes through the voice activity detector: each
    utterance sends C{speech-start} / C{speech-end} and becomes one audio
    turn, mono 16 kHz, on the same path as the C{audio} message;
  - speech that starts while the character is talking is a barge-in: the
    reply is cancelled upstream (C{tts-cancelled}) and the speech track
    falls silent at once; so does a typed C{cancel} or line that barges in
    while the track still plays a reply that completed upstream
    (L{VoiceLink.stopSpeech});
  - once the speech track is negotiated, a turn's audio plays on it
    (L{TrackSpeech}) instead of going out as C{tts-chunk} messages;
    C{tts-start} and C{tts-complete} are still sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.audio.format import encodeBase64, exactLength, strictBase64
from rpmiddleware.protocol.meta import PLAYED_LINE
from rpmiddleware.webrtc.ice import loopbackAddresses
from rpmiddleware.webrtc.peer import (
    CONNECTION_FAILED,
    ICE_FAILED,
    OfferRefused,
    Peer,
    PeerOptions,
)
from rpmiddleware.webrtc.reactor import eventLoop
from rpmiddleware.webrtc.speech import INPUT_RATE, TRACK_RATE, SpeechTrack
from rpmiddleware.webrtc.vad import SAMPLE_RATE, SpeechEnded, SpeechStarted, VoiceActivityDetector

#: Messages that belong to the WebSocket only (signalling and its replies;
#: the pong to a ping that came on the data channel goes on the data channel
#: alone, through the C{reply} of C{connection.received}).
WEBSOCKET_ONLY = frozenset({"ready", "signal", "pong", "reconnect-ack"})


class ClientHost(Protocol):
    """
    What a link uses of the client connection.
    """

    peer: str
    closed: bool
    current: Any  # the Turn playing, with .ended, .ttsStarted, .cancel(reason)
    session: Any  # .id, .config.bargesIn(settings)
    settings: Any  # ClientSettings: .ice_servers

    def send(self, message: dict[str, Any], audio: bool = False) -> bool: ...

    def received(
        self, payload: bytes | str, isBinary: bool, reply: Callable[[dict[str, Any]], Any] | None
    ) -> None: ...

    def submitAudio(self, audio: dict[str, Any]) -> None:
        """An audio turn from RPEngine's event.audio object; raises InvalidMessage."""

    def endedTurnPlayed(
        self, played: Mapping[str, Any] | None = None, turnId: str | None = None
    ) -> bool:
        """
        The most recent turn, completed upstream, was cut off while its
        speech played: the plugins hear how much was played (with no
        C{played}, the track's count); whether they were told.
        """


class TrackSpeech:
    """
    A turn's speech output when the speech track carries it: what the
    endpoint's C{SpeechOutput} does, but into the track.  Returns no
    pieces, so no C{tts-chunk} is sent.
    """

    streaming = True
    #: The rate asked of the audio-resample plugin (C{meta.outputSampleRate}),
    #: so RPEngine's 44.1 kHz is resampled once, straight to the track's rate.
    rate = TRACK_RATE

    def __init__(self, track: SpeechTrack, playing: Callable[[int, str], None]) -> None:
        self.track = track
        self.samples = 0
        self._inRate = INPUT_RATE
        self._playing = playing
        #: The track's turn of each line this output fed, in order (a
        #: scene's turn has several; C{None}: a line began, not fed yet).
        self._lines: list[int | None] = []

    def started(self, fields: Mapping[str, Any]) -> None:
        rate = fields.get("sampleRate")
        self._inRate = rate if type(rate) is int and rate > 0 else INPUT_RATE
        # A line's speech begins (each line of a scene's turn says so).
        self._lines.append(None)

    def chunk(self, fields: Mapping[str, Any]) -> list[str]:
        data = fields.get("data")
        if not isinstance(data, str):
            raise ValueError("reply.audio.chunk has no base64 data")
        try:
            pcm = strictBase64(data)
        except ValueError:
            raise ValueError("reply.audio.chunk data is not valid base64")
        rate = fields.get("sampleRate")
        rate = rate if type(rate) is int and rate > 0 else self._inRate
        pcm = pcm[: len(pcm) - len(pcm) % 2]
        turn = self.track.feed(pcm, rate)
        # A new line (a scene's) is a turn of the track of its own.
        if not self._lines or self._lines[-1] is None:
            if self._lines:
                self._lines[-1] = turn
            else:
                self._lines.append(turn)
        elif self._lines[-1] != turn:
            self._lines.append(turn)
        self._playing(turn, str(fields.get("requestId", "")))
        self.samples += exactLength(len(pcm) // 2, rate, TRACK_RATE)
        return []

    def finish(self) -> list[str]:
        self.track.finish()
        return []

    def played(self) -> dict[str, int] | None:
        """
        How much of the line the track sounds the player has been played
        (the track's playout), and which of this output's lines that is
        (a scene's turn feeds a line after another, while an earlier one
        still sounds): C{{samples, sampleRate, line}}, for
        L{rpmiddleware.protocol.meta.PLAYED}; C{None} before any speech.
        Before the first line sounds (the track still plays an older turn),
        none of it: the first line, no samples.
        """
        fed = [turn for turn in self._lines if turn is not None]
        if not fed:
            return None
        sounding = self.track.sounding
        line = self._lines.index(sounding) if sounding in fed else 0
        samples = self.track.played(sounding) if sounding in fed else 0
        return {"samples": samples, "sampleRate": TRACK_RATE, PLAYED_LINE: line}

    def wav(self) -> bytes:
        raise RuntimeError("speech on the track is never collected into a WAV")


class VoiceLink:
    log = Logger()

    def __init__(self, endpoint: Any, connection: ClientHost) -> None:
        self.endpoint = endpoint
        self.connection = connection
        settings = endpoint.settings
        self.label = f"client {connection.peer} (session {connection.session.id})"
        self.peer = Peer(
            eventLoop(endpoint.reactor),
            PeerOptions(
                iceServers=list(connection.settings.ice_servers),
                addresses=loopbackAddresses(endpoint.interface),
                maxDataBacklog=settings.data_channel_backlog,
            ),
            onMessage=self._dataMessage,
            onAudio=self._audio,
            onChannelOpen=self._channelOpen,
            onClosed=self._peerClosed,
            label=self.label,
        )
        self.vad = VoiceActivityDetector(settings.vad())
        self.utterances = 0
        #: The track's turns -> the client turnId (requestId) each plays.
        self.turnIds: dict[int, str] = {}

    @property
    def closed(self) -> bool:
        return self.peer.closed

    # Signalling.

    def offer(self, signal: Any) -> Deferred[None]:
        """
        Answer, then send C{signal} (or C{error}); never fails.
        """
        d = self.peer.answer(signal)
        return d.addCallbacks(self._answered, self._refused)

    def _answered(self, answer: dict[str, str]) -> None:
        self.log.info(
            "WebRTC {label}: answered offer {count} (speech track: {speaking})",
            label=self.label,
            count=self.peer.offers,
            speaking="yes" if self.peer.speaking else "not yet",
        )
        self.connection.send({"type": "signal", "signal": answer})

    def _refused(self, failure: Failure) -> None:
        if failure.check(OfferRefused):
            error: Any = failure.value
            code, message = error.code, error.message
        else:
            self.log.failure("WebRTC {label}: an offer failed", failure, label=self.label)
            code, message = CONNECTION_FAILED, "the offer could not be answered"
        self.log.info("WebRTC {label}: refused an offer: {why}", label=self.label, why=message)
        self.connection.send(
            {"type": "error", "code": code, "message": message, "retryable": False}
        )

    # Messages both ways.

    def mirror(self, message: Mapping[str, Any]) -> None:
        """
        What the connection sent on its WebSocket: also on the data channel
        (payload messages); a C{tts-cancelled} silences the speech track.
        """
        kind = message.get("type")
        if kind == "tts-cancelled":
            self.peer.speech.clear()
        if kind not in WEBSOCKET_ONLY:
            self.peer.send(message)

    def _dataMessage(self, text: str) -> None:
        if not self.connection.closed:
            # Answers that belong to the channel a message came by (pong)
            # go back on the data channel.
            self.connection.received(text, False, self.peer.send)

    def _channelOpen(self) -> None:
        self.log.info("WebRTC {label}: data channel open", label=self.label)

    # The character's voice.

    def speechOutput(self) -> TrackSpeech | None:
        """
        The speech output for a new turn: the track, once negotiated.
        """
        if self.peer.closed or not self.peer.speaking:
            return None
        return TrackSpeech(self.peer.speech, self._playing)

    def _playing(self, turn: int, turnId: str) -> None:
        if turn not in self.turnIds:
            # Only the newest few are ever looked up (the one still sounding).
            for old in [t for t in self.turnIds if t < turn - 4]:
                del self.turnIds[old]
            self.turnIds[turn] = turnId

    @property
    def characterTalking(self) -> bool:
        turn = self.connection.current
        replying = turn is not None and not turn.ended and bool(turn.ttsStarted)
        return replying or self.peer.speech.playing

    # The player's voice.

    def _audio(self, pcm: bytes) -> None:
        for event in self.vad.feed(pcm):
            if isinstance(event, SpeechStarted):
                self._speechStarted(event)
            elif isinstance(event, SpeechEnded):
                self._speechEnded(event)

    def _speechStarted(self, event: SpeechStarted) -> None:
        connection = self.connection
        self.log.info(
            "WebRTC {label}: speech started at {at:.2f} s",
            label=self.label,
            at=event.sample / SAMPLE_RATE,
        )
        if self.characterTalking and connection.session.config.bargesIn(connection.settings):
            turn = connection.current
            if turn is not None and not turn.ended:
                turn.cancel("interrupted by the player's speech (barge-in)")
            self.stopSpeech("interrupted by the player's speech")
        connection.send({"type": "speech-start"})

    def stopSpeech(self, reason: str, turnId: str | None = None) -> bool:
        """
        The player cut off a reply that ended upstream but still plays on
        the track (the player's speech, a typed C{cancel}, a typed line
        that barges in): silence the track, and tell the plugins how much
        of it the track played (memory keeps the reply only that far),
        whatever the client said it played: the track's count is what was
        played.  C{tts-cancelled} names the turn.  With C{turnId}, only if
        the track plays that turn.  Whether the track was playing it.
        """
        speech = self.peer.speech
        if not speech.playing:
            return False
        sounding = self.turnIds.get(speech.sounding or speech.turn)
        if turnId is not None and turnId != sounding:
            return False
        connection = self.connection
        if sounding:
            connection.endedTurnPlayed(None, sounding)
        speech.clear()
        message = {"type": "tts-cancelled", "reason": reason}
        if sounding:
            message["turnId"] = sounding
        connection.send(message)
        return True

    def _speechEnded(self, event: SpeechEnded) -> None:
        self.utterances += 1
        self.log.info(
            "WebRTC {label}: speech ended; {seconds:.2f} s utterance{truncated}",
            label=self.label,
            seconds=event.seconds,
            truncated=" (cut at the length limit)" if event.truncated else "",
        )
        connection = self.connection
        connection.send({"type": "speech-end"})
        audio: dict[str, Any] = {
            "format": "pcm_s16le",
            "sampleRate": SAMPLE_RATE,
            "channels": 1,
            "data": encodeBase64(event.pcm),
        }
        language = getattr(connection.session.config, "inputLanguage", None)
        if language is not None:
            audio["language"] = language
        try:
            connection.submitAudio(audio)
        except ValueError as e:  # InvalidMessage: no character yet
            connection.send(
                {"type": "error", "code": "INVALID_MESSAGE", "message": str(e), "retryable": False}
            )

    # Closing.

    def _peerClosed(self, reason: str) -> None:
        self.vad.reset()
        self.endpoint.removed(self)
        self.log.info(
            "WebRTC {label}: peer connection closed ({why})", label=self.label, why=reason
        )
        if reason == ICE_FAILED and not self.connection.closed:
            self.connection.send(
                {
                    "type": "error",
                    "code": CONNECTION_FAILED,
                    "message": "the WebRTC connection failed; send a new offer to reconnect",
                    "retryable": True,
                }
            )

    def close(self, reason: str = "the client disconnected") -> Deferred[None]:
        return self.peer.close(reason)
