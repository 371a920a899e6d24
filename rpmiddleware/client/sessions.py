"""
Client sessions: who a client is across reconnects, and what it said.

A session is created for every new connection (its id goes out in C{ready})
and belongs to that connection while it is open.  When the connection goes,
the session is kept for C{session_ttl} seconds so that the client can come
back with C{reconnect} and find its character, its configuration and its
conversation history.  After that it is expired; its id is remembered for a
while longer (bounded) so that a late client hears SESSION_EXPIRED rather
than SESSION_NOT_FOUND, which tells it to start over rather than suspect a
typo.

Time comes from an L{IReactorTime} so that tests drive the TTL with a Clock.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from rpmiddleware.client.messages import Attachment
from rpmiddleware.client.settings import Character, ClientSettings
from rpmiddleware.protocol.clienterrors import InvalidMessage
from rpmiddleware.protocol.messages import SPEECH_MODEL
from rpmiddleware.protocol.meta import FEELINGS
from rpmiddleware.protocol.rules import EngineRefusal, checkOutput, checkPromptContext
from rpmiddleware.protocol.speechmarks import META as SPEECH_MARKS

#: Expired session ids remembered so they can be told apart from unknown ones.
EXPIRED_MEMORY = 4096


@dataclass(frozen=True)
class ClientConfig:
    """
    What a client asked for with C{configure}; C{None} means "the default".
    """

    modalities: list[str] | None = None
    language: str | None = None
    voice: str | None = None
    sampleRate: int | None = None
    streaming: bool | None = None
    audioProcessing: str | None = None
    responseProcessing: dict[str, Any] | None = None
    player: dict[str, Any] | None = None
    interactionMode: str | None = None
    promptScene: dict[str, Any] | None = None
    promptDirective: dict[str, Any] | None = None
    inputLanguage: str | None = None
    silenceBehavior: str | None = None
    bargeIn: bool | None = None
    #: Where the reply's feelings come from (the feelings plugin reads it).
    feelings: str | None = None
    #: The kinds of speech marks asked for (the speech-marks plugin reads them).
    speechMarks: tuple[str, ...] | None = None

    def updated(self, changes: dict[str, Any]) -> ClientConfig:
        return replace(self, **changes)

    # What a turn uses, with the endpoint's defaults filled in.

    def wantsAudio(self) -> bool:
        return "audio" in (self.modalities or ["text", "audio"])

    def output(self, defaults: ClientSettings) -> dict[str, Any]:
        """
        The reply.request (and voice.capture.start) C{output} object, in
        RPEngine's shape (docs/protocol-v3.md of RPEngine: modalities,
        language, audio {model, voice, format, processing {profile}},
        responseProcessing).
        """
        output: dict[str, Any] = {
            "modalities": list(self.modalities or ["text", "audio"]),
            "language": self.language or defaults.default_language,
        }
        if self.wantsAudio():
            audio: dict[str, Any] = {
                "model": SPEECH_MODEL,
                "voice": self.voice or defaults.default_voice,
                "format": "pcm_s16le",
            }
            if self.audioProcessing is not None:
                audio["processing"] = {"profile": self.audioProcessing}
            output["audio"] = audio
        if self.responseProcessing is not None:
            output["responseProcessing"] = self.responseProcessing
        return output

    def silence(self) -> str:
        """
        voice.capture.start's C{silenceBehavior}: what RPEngine does when a
        capture's recording holds no words (RPEngine's default, "error").
        """
        return self.silenceBehavior or "error"

    def check(self, defaults: ClientSettings, where: str) -> None:
        """
        Check what this configuration would send with RPEngine's own rules
        (L{rpmiddleware.protocol.rules}), so that a client learns the exact
        field at once instead of from RPEngine's refusal of a turn.

        @param where: the message the settings came in (C{configure},
            C{text.options}), to name the field.
        @raise InvalidMessage: naming the field and what is wrong.
        """
        try:
            checkOutput(self.output(defaults))
            checkPromptContext(self.promptFields())
        except EngineRefusal as e:
            raise InvalidMessage(f"{where}.{e}") from None

    def outputRate(self, defaults: ClientSettings) -> int:
        return self.sampleRate or defaults.default_sample_rate

    def streams(self, defaults: ClientSettings) -> bool:
        return defaults.streaming if self.streaming is None else self.streaming

    def bargesIn(self, defaults: ClientSettings) -> bool:
        return defaults.barge_in if self.bargeIn is None else self.bargeIn

    def promptFields(self) -> dict[str, Any]:
        """
        The optional reply.request fields a client set.
        """
        fields: dict[str, Any] = {}
        for name in ("interactionMode", "promptScene", "promptDirective"):
            value = getattr(self, name)
            if value is not None:
                fields[name] = value
        return fields

    def pluginMeta(self) -> dict[str, Any]:
        """
        What the client asked of plugins, for the request's C{meta}
        (L{rpmiddleware.protocol.meta.FEELINGS}).
        """
        meta: dict[str, Any] = {FEELINGS: self.feelings} if self.feelings is not None else {}
        if self.speechMarks:
            meta[SPEECH_MARKS] = self.speechMarks
        return meta


@dataclass
class ClientSession:
    """
    One client's identity and conversation.

    @ivar owner: the connection using this session now, or C{None} while
        it waits for a reconnect.
    """

    id: str
    historyLimit: int
    config: ClientConfig = field(default_factory=ClientConfig)
    character: Character | None = None
    attachments: list[Attachment] = field(default_factory=list)
    owner: Any = None
    detachedAt: float | None = None
    history: deque[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.history = deque(maxlen=self.historyLimit or None)

    def remember(self, role: str, text: str, **details: Any) -> None:
        """
        Add a player turn or a character reply to the history.
        """
        if self.historyLimit:
            self.history.append({"role": role, "text": text, **details})

    def takeAttachments(self) -> list[Attachment]:
        taken, self.attachments = self.attachments, []
        return taken


class SessionLookupError(LookupError):
    """
    A reconnect to a session that is unknown (C{expired} false) or expired.
    """

    def __init__(self, sessionId: str, expired: bool) -> None:
        super().__init__(sessionId)
        self.expired = expired


class SessionStore:
    """
    Every live session and the detached ones still within their TTL.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, settings: ClientSettings) -> None:
        self.clock = clock
        self.settings = settings
        #: Called with the id of each session that is over (expired, or
        #: discarded for another); the endpoint tells the plugins.
        self.onEnded: Callable[[str], object] = lambda sessionId: None
        self._sessions: dict[str, ClientSession] = {}
        #: Detached sessions, oldest detach first, for sweeping.
        self._detached: OrderedDict[str, ClientSession] = OrderedDict()
        self._expired: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, sessionId: object) -> bool:
        """
        Whether C{sessionId} is a session kept here (connected or waiting
        for its C{reconnect}).
        """
        return sessionId in self._sessions

    def create(self, owner: Any) -> ClientSession:
        self.sweep()
        session = ClientSession(uuid.uuid4().hex, self.settings.history_limit, owner=owner)
        self._sessions[session.id] = session
        return session

    def detach(self, session: ClientSession) -> None:
        """
        The session's connection went away: keep it for the TTL.
        """
        if self._sessions.get(session.id) is not session:
            return
        session.owner = None
        session.detachedAt = self.clock.seconds()
        self._detached[session.id] = session
        self._detached.move_to_end(session.id)
        self.sweep()

    def discard(self, session: ClientSession) -> None:
        """
        Forget a session at once (a connection adopted another one).
        """
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
            self.onEnded(session.id)
        self._detached.pop(session.id, None)

    def resume(self, sessionId: str, owner: Any) -> tuple[ClientSession, Any]:
        """
        Hand a session to a (new) connection.

        @return: the session and its previous owner (a connection the caller
            closes), or C{None} if it was detached.
        @raise SessionLookupError: unknown or expired.
        """
        self.sweep()
        session = self._sessions.get(sessionId)
        if session is None:
            raise SessionLookupError(sessionId, sessionId in self._expired)
        self._detached.pop(sessionId, None)
        previous, session.owner = session.owner, owner
        session.detachedAt = None
        return session, previous

    def sweep(self) -> None:
        """
        Expire detached sessions past their TTL, and the oldest beyond
        C{max_sessions}.  Called on every change, so memory stays bounded
        without a timer.
        """
        now = self.clock.seconds()
        ttl = self.settings.session_ttl
        while self._detached:
            sessionId, session = next(iter(self._detached.items()))
            tooMany = len(self._detached) > self.settings.max_sessions
            stale = session.detachedAt is not None and now - session.detachedAt >= ttl
            if not (tooMany or stale):
                break
            del self._detached[sessionId]
            self._sessions.pop(sessionId, None)
            self._expired[sessionId] = None
            self.log.debug(
                "client session {sessionId} expired", sessionId=sessionId, tooMany=tooMany
            )
            self.onEnded(sessionId)
        while len(self._expired) > EXPIRED_MEMORY:
            self._expired.popitem(last=False)
