"""
The audio-resample plugin: lets games speak any PCM to RPEngine and hear its
speech at the rate they play.

RPEngine accepts only mono 16 kHz PCM of at most 30 s and always speaks
44.1 kHz mono PCM16.  Games record at whatever their engine uses and often
mix at 48 or 24 kHz; converting here spares every integration a resampler
and, going out, keeps a reply's chunks continuous, which a game resampling
each chunk on its own cannot (every chunk edge would click).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from zope.interface import implementer

from rpmiddleware.plugin import (
    INPUT_AUDIO_FORMATS,
    INPUT_SAMPLE_RATE,
    MAX_INPUT_AUDIO_SECONDS,
    OPENING,
    OUTPUT_SAMPLE_RATE,
    QUALITIES,
    TERMINAL,
    AudioError,
    ChainPlugin,
    Envelope,
    IChainContext,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IPluginServices,
    ITimingSource,
    PluginFactory,
    PluginSettings,
    canonicalFormat,
    decodeBase64,
    encodeBase64,
    endsSegment,
    importFrozen,
)

if TYPE_CHECKING:
    from rpmiddleware.plugin import pcm

NAME = "audio-resample"
MIN_RATE = 8000
MAX_RATE = 192000
#: Seconds after a segment's first chunk that the next segment's resampler
#: is made: the chunk has been written by then, and speech chunks come
#: tens of milliseconds apart.
PREPARE_DELAY = 0.005


class ResampleSettings(PluginSettings):
    """
    The plugin's TOML table, checked.
    """

    #: The format converted input audio is sent to RPEngine in.
    engine_format: str = "pcm_s16le"
    #: Output rate for requests that do not say theirs; 0 leaves 44.1 kHz.
    default_output_rate: int = 0
    #: soxr quality recipe, both directions.
    quality: str = "HQ"

    def __post_init__(self) -> None:
        if self.engine_format not in INPUT_AUDIO_FORMATS:
            raise ValueError(
                f"engine_format must be one of {', '.join(sorted(INPUT_AUDIO_FORMATS))}, "
                f"got {self.engine_format!r}"
            )
        rate = self.default_output_rate
        if not _isRate(rate) and rate != 0:
            raise ValueError(
                f"default_output_rate must be 0 or a whole number from {MIN_RATE} to "
                f"{MAX_RATE}, got {rate!r}"
            )
        if self.quality not in QUALITIES:
            raise ValueError(f"quality must be one of {', '.join(QUALITIES)}, got {self.quality!r}")

    @classmethod
    def fromMapping(cls, settings: Mapping[str, Any]) -> ResampleSettings:
        """
        The table read as the factory reads it.

        @raise ValueError: naming C{plugins.audio-resample.KEY}.
        """
        return cls.read(settings, NAME)


def _isRate(value: Any) -> TypeGuard[int]:
    return type(value) is int and MIN_RATE <= value <= MAX_RATE


def normalizeEventAudio(
    audio: Any, engineFormat: str = "pcm_s16le", quality: str = "HQ"
) -> dict[str, Any] | None:
    """
    The C{event.audio} object RPEngine accepts for C{audio}.

    @return: C{None} when C{audio} already conforms (it is then sent as it
        came, bytes untouched), else a new object in C{engineFormat}.
    @raise AudioError: saying exactly what cannot be converted, naming the
        field, fit for a C{request.error} message.
    """
    # numpy and soxr: imported with the first audio, not when the daemon starts.
    from rpmiddleware.plugin import pcm

    if not isinstance(audio, Mapping):
        raise AudioError("event.audio must be an object")
    try:
        fmt = canonicalFormat(audio.get("format"))
        rate = audio.get("sampleRate")
        if not _isRate(rate):
            raise AudioError(
                f"sampleRate must be a whole number from {MIN_RATE} to {MAX_RATE}, got {rate!r}"
            )
        channels = audio.get("channels", 1)
        if type(channels) is not int or channels not in (1, 2):
            raise AudioError(f"channels must be 1 or 2, got {channels!r}")
        raw = decodeBase64(audio.get("data"))
        if not raw:
            raise AudioError("data is empty")
        frames = pcm.decodePcm(raw, fmt, channels)
    except AudioError as e:
        raise AudioError(f"event.audio.{e}")
    seconds = len(frames) / rate
    if seconds > MAX_INPUT_AUDIO_SECONDS:
        raise AudioError(
            f"event.audio is {seconds:.3f} s long; RPEngine accepts at most "
            f"{MAX_INPUT_AUDIO_SECONDS:g} s"
        )
    conforming = audio.get("format") in INPUT_AUDIO_FORMATS
    if conforming and rate == INPUT_SAMPLE_RATE and channels == 1:
        return None
    mono = pcm.resample(pcm.toMono(frames), rate, INPUT_SAMPLE_RATE, quality)
    return {
        **audio,
        "format": engineFormat,
        "sampleRate": INPUT_SAMPLE_RATE,
        "channels": 1,
        "data": encodeBase64(pcm.encodePcm(mono, engineFormat)),
    }


@dataclass
class _Segment:
    """
    One sentence of speech being resampled as its chunks pass.
    """

    key: Any
    resampler: pcm.Pcm16Resampler
    #: A byte of a PCM16 sample split across two chunks.
    carry: bytes = b""
    lastChunkSequence: Any = None


@dataclass
class _Reply:
    """
    Output conversion state of one request.
    """

    outRate: int
    inRate: int = OUTPUT_SAMPLE_RATE
    segment: _Segment | None = None
    #: A resampler made ahead for the next segment, so that setting up soxr
    #: does not delay a segment's first chunk.
    spare: pcm.Pcm16Resampler | None = None
    #: The call that will make the next one.
    preparing: IDelayedCall | None = None
    #: Tail chunks originated so far: later chunks' sequence moves up by this.
    shift: int = 0
    lastSequence: int | None = None
    bytesOut: int = 0

    @property
    def converting(self) -> bool:
        return self.inRate != self.outRate


def _newResampler(inRate: int, outRate: int, quality: str) -> pcm.Pcm16Resampler:
    """
    A segment's resampler.  numpy and soxr are normally imported when
    RPEngine connects (L{AudioResample.engineSessionStarted}); otherwise the
    first one made imports them (about 90 ms, once).
    """
    from rpmiddleware.plugin import pcm

    return pcm.Pcm16Resampler(inRate, outRate, quality)


@implementer(IEnvelopePlugin, ITimingSource)
class AudioResample(ChainPlugin):
    """
    Converts input audio to what RPEngine accepts and output speech to the
    rate each requester asked for in C{meta["outputSampleRate"]}.
    """

    name = NAME
    log = Logger()

    def __init__(self, settings: ResampleSettings | None = None) -> None:
        self.settings = settings or ResampleSettings()
        self._rates: dict[str, int] = {}
        self._replies: dict[str, _Reply] = {}
        #: Called with (direction, seconds) after each conversion: metrics.
        self.timingObservers: list[Callable[[str, float], None]] = []

    def _timed(self, direction: str, started: float, context: IChainContext) -> None:
        elapsed = context.reactor.seconds() - started
        for observer in list(self.timingObservers):
            try:
                observer(direction, elapsed)
            except Exception:
                self.log.failure("a timing observer failed")

    # Toward RPEngine.

    def envelopeToEngine(self, envelope: Envelope, context: IChainContext) -> Any:
        kind = envelope.type
        if kind in OPENING:
            self._rememberRate(envelope)
        if kind != "reply.request":
            return envelope
        event = envelope.get("event")
        if not isinstance(event, dict) or event.get("audio") is None:
            return envelope
        started = context.reactor.seconds()
        try:
            converted = normalizeEventAudio(
                event["audio"], self.settings.engine_format, self.settings.quality
            )
        except AudioError as e:
            self._refuse(envelope, context, str(e))
            return None
        self._timed("to_engine", started, context)
        if converted is not None:
            envelope["event"] = {**event, "audio": converted}
        return envelope

    def _rememberRate(self, envelope: Envelope) -> None:
        requestId = envelope.requestId
        if requestId is None:
            return
        rate = envelope.meta.get("outputSampleRate")
        if rate is None or rate == 0:
            self._rates.pop(requestId, None)
        elif _isRate(rate):
            self._rates[requestId] = rate
        else:
            self.log.warn(
                "request {requestId} asked for output sample rate {rate!r}, not a whole "
                "number from {low} to {high}; using the default",
                requestId=requestId,
                rate=rate,
                low=MIN_RATE,
                high=MAX_RATE,
            )
            self._rates.pop(requestId, None)
        reply = self._reply(requestId)
        if reply is not None:
            # The reply's speech will come at RPEngine's rate: its first
            # segment's resampler is made now, long before the first chunk.
            self._prepare(reply)

    def _refuse(self, envelope: Envelope, context: IChainContext, message: str) -> None:
        requestId = envelope.requestId
        self._rates.pop(requestId or "", None)
        self._forget(self._replies.pop(requestId or "", None))
        fields: dict[str, Any] = {}
        if requestId is not None:
            fields["requestId"] = requestId
        if envelope.messageId is not None:
            fields["sourceMessageId"] = envelope.messageId
        session = context.session
        answer = Envelope.build(
            "request.error",
            session.sessionId if session is not None else None,
            **fields,
            code="invalid_audio",
            message=message,
            retryable=False,
        )
        answer.meta["synthetic"] = True
        self.log.info("refused the audio of {requestId}: {why}", requestId=requestId, why=message)
        context.sendToGame(answer)

    # Toward the game.

    def envelopeToGame(self, envelope: Envelope, context: IChainContext) -> Any:
        requestId = envelope.requestId
        if requestId is None:
            return envelope
        kind = envelope.type
        if kind == "reply.audio.chunk":
            reply = self._reply(requestId)
            if reply is not None and reply.converting:
                started = context.reactor.seconds()
                self._convertChunk(reply, requestId, envelope, context)
                self._timed("to_game", started, context)
        elif kind == "reply.audio.start":
            reply = self._reply(requestId)
            if reply is not None:
                rate = envelope.get("sampleRate")
                reply.inRate = rate if _isRate(rate) else OUTPUT_SAMPLE_RATE
                if reply.converting:
                    envelope["sampleRate"] = reply.outRate
        elif kind == "reply.audio.completed":
            reply = self._replies.get(requestId)
            if reply is not None and reply.converting:
                self._endSegment(reply, envelope, context)
                # RPEngine's totals (app.rs complete_if_ready), told for
                # the audio the game receives.
                if type(envelope.get("chunkCount")) is int:
                    envelope["chunkCount"] += reply.shift
                if type(envelope.get("totalBytes")) is int:
                    envelope["totalBytes"] = reply.bytesOut
        else:
            if kind in TERMINAL:
                reply = self._replies.pop(requestId, None)
                self._rates.pop(requestId, None)
                if reply is not None:
                    self._forget(reply)
                    self._endSegment(reply, envelope, context)
        return envelope

    def _reply(self, requestId: str) -> _Reply | None:
        reply = self._replies.get(requestId)
        if reply is None:
            rate = self._rates.get(requestId, self.settings.default_output_rate)
            if not rate:
                return None
            reply = self._replies[requestId] = _Reply(rate)
        return reply

    def _forget(self, reply: _Reply | None) -> None:
        """
        A reply is over: nothing more is made for it.
        """
        if reply is not None:
            reply.spare = None
            if reply.preparing is not None:
                if reply.preparing.active():
                    reply.preparing.cancel()
                reply.preparing = None

    def _prepare(self, reply: _Reply) -> None:
        """
        Make the resampler of the reply's next segment, if it converts.
        """
        if reply.spare is None and reply.converting:
            reply.spare = _newResampler(reply.inRate, reply.outRate, self.settings.quality)

    def _resampler(self, reply: _Reply, context: IChainContext) -> pcm.Pcm16Resampler:
        """
        The resampler of a segment that begins: the one made ahead when it
        fits.  The next segment's is made a moment later: not at once,
        because the reactor writes this chunk only on its next turn, and
        setting up soxr first would delay it.
        """
        spare, reply.spare = reply.spare, None

        def prepare() -> None:
            reply.preparing = None
            self._prepare(reply)

        if reply.preparing is None:
            reply.preparing = context.reactor.callLater(PREPARE_DELAY, prepare)
        if spare is not None and (spare.inRate, spare.outRate) == (reply.inRate, reply.outRate):
            return spare
        return _newResampler(reply.inRate, reply.outRate, self.settings.quality)

    def _convertChunk(
        self, reply: _Reply, requestId: str, envelope: Envelope, context: IChainContext
    ) -> None:
        fields = envelope.fields
        key = fields.get("segmentSequence")
        segment = reply.segment
        if segment is not None and segment.key != key:
            # A new sentence began before the last one said it was complete.
            self._endSegment(reply, envelope, context)
            segment = None
        if segment is None:
            resampler = self._resampler(reply, context)
            segment = reply.segment = _Segment(key, resampler)
        try:
            raw = decodeBase64(fields.get("data"))
        except AudioError as e:
            self.log.warn(
                "reply.audio.chunk {sequence} of {requestId}: {why}; its audio is skipped",
                sequence=fields.get("sequence"),
                requestId=requestId,
                why=str(e),
            )
            raw = b""
        if segment.carry:
            raw = segment.carry + raw
        if len(raw) % 2:
            segment.carry = raw[-1:]
            raw = raw[:-1]
        else:
            segment.carry = b""
        last = endsSegment(fields)
        out = segment.resampler.feed(raw, last)
        segment.lastChunkSequence = fields.get("segmentChunkSequence")
        if last:
            reply.segment = None
        sequence = fields.get("sequence")
        if type(sequence) is int:
            fields["sequence"] = sequence + reply.shift
            reply.lastSequence = sequence + reply.shift
        self._write(reply, fields, out)

    def _write(self, reply: _Reply, fields: dict[str, Any], pcm: bytes) -> None:
        reply.bytesOut += len(pcm)
        fields["data"] = encodeBase64(pcm)
        fields["sampleRate"] = reply.outRate
        fields["samples"] = len(pcm) // 2

    def _endSegment(self, reply: _Reply, current: Envelope, context: IChainContext) -> None:
        """
        Flush a segment that ended without its last chunk, sending its
        tail as one more chunk ahead of C{current}.
        """
        segment, reply.segment = reply.segment, None
        if segment is None:
            return
        tail = segment.resampler.flush()
        if not tail:
            return
        fields: dict[str, Any] = {"requestId": current.requestId}
        if reply.lastSequence is not None:
            fields["sequence"] = reply.lastSequence + 1
            reply.lastSequence += 1
            reply.shift += 1
        fields["segmentSequence"] = segment.key
        if type(segment.lastChunkSequence) is int:
            fields["segmentChunkSequence"] = segment.lastChunkSequence + 1
            fields["segmentChunkCount"] = segment.lastChunkSequence + 2
        self._write(reply, fields, tail)
        chunk = Envelope.build("reply.audio.chunk", current.sessionId, **fields)
        chunk.meta["synthetic"] = True
        context.sendToGame(chunk)

    def engineSessionStarted(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        """
        RPEngine is here, so speech will follow: numpy and soxr are imported
        now (a reactor turn later, once the session's welcome is written),
        while no request waits, instead of with the first reply's request.
        """
        if "rpmiddleware.audio.pcm" not in sys.modules:
            context.reactor.callLater(0, importFrozen, "rpmiddleware.audio.pcm")

    def engineSessionEnded(self, session: IEngineSessionInfo, context: IChainContext) -> None:
        self._rates.clear()
        replies, self._replies = self._replies, {}
        for reply in replies.values():
            self._forget(reply)


def _build(settings: ResampleSettings, services: IPluginServices) -> AudioResample:
    return AudioResample(settings)


audioResample = PluginFactory(
    NAME,
    "Converts input audio to 16 kHz mono PCM and RPEngine's speech to the requester's rate.",
    _build,
    settings=ResampleSettings,
)
