"""
One reply's speech, as the client asked for it: streamed PCM chunks at its
rate, or one WAV at the end.

The audio-resample plugin normally converts RPEngine's 44.1 kHz chunks to
the rate in C{meta["outputSampleRate"]} and says so in each chunk's
C{sampleRate}; such chunks pass through here untouched (not even
base64-decoded).  If a chain runs without that plugin, the chunks arrive at
another rate and are converted here with the same streaming resampler, one
per sentence segment, so the client gets the rate it asked for either way
(numpy and soxr are imported for the first such segment, not before).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rpmiddleware.audio.format import (
    base64Bytes,
    encodeBase64,
    endsSegment,
    pcm16Wav,
    strictBase64,
)
from rpmiddleware.protocol.messages import OUTPUT_SAMPLE_RATE

if TYPE_CHECKING:
    from rpmiddleware.audio.pcm import Pcm16Resampler

#: Longest reply collected for a non-streaming C{tts} WAV: it is held in
#: memory and sent as one message (17 MB of PCM at 48 kHz).
MAX_WAV_SECONDS = 180.0
QUALITY = "HQ"


class SpeechTooLong(Exception):
    """
    A non-streaming reply's speech outgrew L{MAX_WAV_SECONDS}.
    """


def _rate(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


class SpeechOutput:
    """
    Converts one reply's C{reply.audio.*} envelopes to what the client gets.

    @ivar samples: samples handed out (or collected) so far, at L{rate}.
    """

    def __init__(self, rate: int, streaming: bool, maxSeconds: float = MAX_WAV_SECONDS) -> None:
        self.rate = rate
        self.streaming = streaming
        self.samples = 0
        self._maxBytes = int(maxSeconds * rate) * 2
        self._inRate = OUTPUT_SAMPLE_RATE
        self._segment: Any = None
        self._resampler: Pcm16Resampler | None = None
        #: The input rate of the segment being resampled.
        self._segmentRate = OUTPUT_SAMPLE_RATE
        self._carry = b""
        self._collected: list[bytes] = []
        self._collectedBytes = 0

    def started(self, fields: Mapping[str, Any]) -> None:
        """
        C{reply.audio.start}: remember the rate chunks will come at.
        """
        self._inRate = _rate(fields.get("sampleRate")) or OUTPUT_SAMPLE_RATE

    def chunk(self, fields: Mapping[str, Any]) -> list[str]:
        """
        One C{reply.audio.chunk}: the base64 PCM pieces to send now (none
        when not streaming, or while the resampler fills).

        @raise SpeechTooLong: when collecting for a WAV outgrows the bound.
        @raise ValueError: when the chunk's data is not base64.
        """
        data = fields.get("data")
        if not isinstance(data, str):
            raise ValueError("reply.audio.chunk has no base64 data")
        inRate = _rate(fields.get("sampleRate")) or self._inRate
        out: list[bytes | str] = []
        key = fields.get("segmentSequence")
        if self._resampler is not None and (key != self._segment or inRate != self._segmentRate):
            out.append(self._flushSegment())
        if inRate == self.rate and self._resampler is None:
            out.append(data)
        else:
            if self._resampler is None:
                # numpy and soxr: loaded by the first segment converted here (with
                # the audio-resample plugin in the chain, none is).
                from rpmiddleware.audio.pcm import Pcm16Resampler

                self._resampler = Pcm16Resampler(inRate, self.rate, QUALITY)
                self._segment = key
                self._segmentRate = inRate
            raw = self._carry + _decode(data)
            cut = len(raw) - len(raw) % 2
            self._carry = raw[cut:]
            last = endsSegment(fields)
            out.append(self._resampler.feed(raw[:cut], last))
            if last:
                self._resampler = None
        return self._emit(out)

    def finish(self) -> list[str]:
        """
        C{reply.audio.completed} (or the end of the reply): the rest.
        """
        if self._resampler is None:
            return []
        return self._emit([self._flushSegment()])

    def played(self) -> dict[str, int] | None:
        """
        How much of the speech the player was played: not known here (the
        client plays it; it may say so with C{played}, see
        L{rpmiddleware.client.turns.Turn.cancel}).
        """
        return None

    def wav(self) -> bytes:
        """
        Everything collected since the last call, as one WAV at the client's
        rate (a scene's turn has a WAV for each line).
        """
        collected, self._collected, self._collectedBytes = self._collected, [], 0
        return pcm16Wav(b"".join(collected), self.rate)

    def _flushSegment(self) -> bytes:
        resampler, self._resampler, self._carry = self._resampler, None, b""
        assert resampler is not None
        return resampler.flush()

    def _emit(self, pieces: list[bytes | str]) -> list[str]:
        result: list[str] = []
        for piece in pieces:
            if isinstance(piece, str):
                size = base64Bytes(piece)
                if not self.streaming:
                    piece = _decode(piece)
            else:
                size = len(piece)
            if not size:
                continue
            self.samples += size // 2
            if self.streaming:
                result.append(piece if isinstance(piece, str) else encodeBase64(piece))
            else:
                assert isinstance(piece, bytes)
                self._collectedBytes += len(piece)
                if self._collectedBytes > self._maxBytes:
                    self._collected = []
                    raise SpeechTooLong(
                        f"the reply's speech is longer than {self._maxBytes // 2 // self.rate} s; "
                        "ask for streaming audio (configure output.streaming true)"
                    )
                self._collected.append(piece)
        return result


def _decode(data: str) -> bytes:
    try:
        return strictBase64(data)
    except ValueError:
        raise ValueError("reply.audio.chunk data is not valid base64")
