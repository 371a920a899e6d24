"""
The messages that ask for a turn or stop one: C{text}, C{audio},
C{voice-capture} and C{cancel}.

Each is checked here and becomes a request to the middleware's Python API;
the connection's turn queue (L{rpmiddleware.client.turnqueue}) decides when
the turn plays (now, cancelling the one playing, or queued behind it), and
L{rpmiddleware.client.turns.Turn} follows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.client import messages as wire
from rpmiddleware.client.attachments import attachmentContext, keepAttachments
from rpmiddleware.client.sessions import ClientConfig
from rpmiddleware.client.surface import ClientSurface
from rpmiddleware.client.turns import TEXT, VOICE
from rpmiddleware.core.replystream import ReplyStream
from rpmiddleware.protocol import clientfields
from rpmiddleware.protocol.clienterrors import (
    INTERNAL_ERROR,
    INVALID_MESSAGE,
    AudioDecodeError,
    InvalidMessage,
)

if TYPE_CHECKING:
    from rpmiddleware.client.decode import DecodedAudio

log = Logger()


def turnConfig(client: ClientSurface, message: dict[str, Any]) -> ClientConfig:
    """
    The configuration a turn plays with: the session's, with the turn's
    own C{options} (checked like C{configure}'s) over it.  Taken when the
    turn is sent, so a later C{configure} does not change a turn that
    waits behind another.
    """
    changes = wire.turnOptions(message)
    config = client.session.config
    if changes:
        config = config.updated(changes)
        config.check(client.settings, f"{message['type']}.options")
    return config


def handleText(client: ClientSurface, message: dict[str, Any]) -> None:
    typed = clientfields.string(message, "text")
    config = turnConfig(client, message)
    played = wire.played(message)
    client.character()
    context = attachmentContext(client)

    def open(request: dict[str, Any]) -> ReplyStream:
        text = typed if context is None else f"{context}\n{typed}"
        return client.middleware.requestReply(text=text, **request)

    client.submit(TEXT, typed, open, config, played)


def handleAudio(client: ClientSurface, message: dict[str, Any]) -> Deferred[None]:
    """
    A recording: decoded (off the reactor thread) before its turn starts;
    the connection reads nothing else meanwhile.
    """
    data = clientfields.string(message, "data")
    attached = wire.attachments(message, required=False)
    config = turnConfig(client, message)
    played = wire.played(message)
    client.character()
    if attached:
        keepAttachments(client, attached, "this turn")

    def decoded(audio: DecodedAudio) -> None:
        if client.closed:
            return
        log.info(
            "client {peer} sent {seconds:.2f} s of {container} audio ({rate} Hz, {channels} ch)",
            peer=client.peer,
            seconds=audio.seconds,
            container=audio.container,
            rate=audio.sampleRate,
            channels=audio.channels,
        )
        try:
            client.submitAudio(audio.eventAudio(config.inputLanguage), config, played)
        except InvalidMessage as e:
            client.error(INVALID_MESSAGE, str(e))

    def undecodable(failure: Failure) -> None:
        if client.closed:
            return
        if failure.check(AudioDecodeError):
            error: Any = failure.value
            log.info("refused audio from client {peer}: {why}", peer=client.peer, why=error.message)
            client.error(error.code, error.message)
        else:
            log.failure("decoding audio from client {peer} failed", failure, peer=client.peer)
            client.error(INTERNAL_ERROR, "the middleware failed while decoding the audio")

    return client.decode(data).addCallbacks(decoded, undecodable)


def handleVoiceCapture(client: ClientSurface, message: dict[str, Any]) -> None:
    """
    C{start}: a turn on RPEngine's microphone (voice.capture.start, with
    C{returnTranscript: true} so the client is told the words, and the
    turn's C{silenceBehavior}); C{stop}: end the player's speech now
    (voice.capture.stop, also while the player speaks); C{cancel}: throw
    the capture (or the reply it became) away.
    """
    action = wire.voiceAction(message)
    turn = client.current
    live = turn is not None and not (turn.ended or turn.silenced)
    capture = turn if live and turn is not None and turn.kind == VOICE else None
    if action == "start":
        config = turnConfig(client, message)
        played = wire.played(message)
        client.character()
        if capture is not None and capture.capturePhase:
            # RPEngine has one capture at a time and would answer
            # voice_capture_active; say so here, naming what to do.
            raise InvalidMessage(
                f"voice-capture start: a voice capture is already in progress "
                f"(turn {capture.id}); send voice-capture stop or cancel first"
            )
        silence = config.silence()

        def open(request: dict[str, Any]) -> ReplyStream:
            return client.middleware.captureVoice(
                returnTranscript=True, silenceBehavior=silence, **request
            )

        client.submit(VOICE, None, open, config, played)
    elif capture is None:
        raise InvalidMessage(f"voice-capture {action}: no voice capture is in progress")
    elif action == "stop":
        # After speech_ended RPEngine stops the capture itself; a stop
        # that crossed it has nothing left to do.
        if capture.stopCapture():
            client.middleware.stopVoiceCapture(capture.stream)
    else:
        capture.cancel(played=wire.played(message))


def handleCancel(client: ClientSurface, message: dict[str, Any]) -> None:
    """
    Stop the turn playing, and those waiting; C{played} (how much of its
    speech the client played) goes with the cancel.  With C{turnId}, only
    the turn it names is cancelled (a cancel that crossed that turn's end
    stops no newer one).

    A cancel with C{played} while no turn plays is about the client's most
    recent turn, whose reply completed upstream while the client still
    played its speech: the plugins hear how much was played (memory then
    remembers the reply only that far), when no newer turn started and
    C{turnId}, if given, names that turn.  Nothing is sent back: that turn
    already ended with C{reply-complete}.  Over WebRTC, a cancel while the
    speech track still plays that turn silences it (C{tts-cancelled}), and
    the plugins hear the track's count, with or without C{played}.
    """
    played = wire.played(message)
    turnId = clientfields.identifier(message, "turnId", required=False)
    client.dropWaiting("a waiting turn was cancelled by the client")
    turn = client.current
    if turn is not None and not turn.ended:
        if turnId is None or turnId == turn.id:
            turn.cancel(played=played)
    elif client.stopTrack("cancelled by the client", turnId):
        pass
    elif played is not None:
        client.endedTurnPlayed(played, turnId)
