"""
espeak-ng, through its C library: a sentence's phonemes, and a synthesis of
it whose every word and phoneme has a known sample position.

Why ctypes on C{libespeak-ng.so.1} rather than a Python binding: what
alignment needs is espeak-ng's synthesis callback, which hands over the
audio together with its word and phoneme events (with sample positions and
IPA names).  The maintained Python packages around espeak-ng either only
phonemize (phonemizer) or drive the command line (no events); the C API is
small, stable (espeak's since 2007) and ships with Debian's C{libespeak-ng1},
so the binding is a few structures here, with nothing to build.

The library keeps one global state, so every use goes through L{LOCK}: a
synthesis is serialized with any other (each takes a few milliseconds of CPU
per second of speech; ctypes lets go of the GIL while the C code runs).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass
from typing import Any

import numpy
from numpy.typing import NDArray

#: Serializes every call into the library, whose state is global.
LOCK = threading.Lock()

# espeak_AUDIO_OUTPUT: synthesize into the callback, return when done.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
# espeak_Initialize options.
_PHONEME_EVENTS = 0x0001
_PHONEME_IPA = 0x0002
_DONT_EXIT = 0x8000
# espeak_EVENT_TYPE.
_LIST_TERMINATED = 0
_WORD = 1
_PHONEME = 7
# espeak_PARAMETER.
_RATE = 1
_PITCH = 3
_RANGE = 4
# espeak_TextToPhonemes: IPA names, "_" between phonemes (bits 8-23).
_IPA_SEPARATED = 0x02 | (ord("_") << 8)
# espeak_POSITION_TYPE, synth flags.
_POS_CHARACTER = 1
_CHARS_UTF8 = 1


class _EventId(ctypes.Union):
    _fields_ = [
        ("number", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("string", ctypes.c_char * 8),
    ]


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_short),
    ctypes.c_int,
    ctypes.POINTER(_Event),
)


@dataclass(frozen=True)
class Phoneme:
    """One phoneme of a synthesis."""

    #: Where it starts, in samples from the synthesis's first.
    sample: int
    #: Its IPA name; C{""} for a pause.
    name: str
    #: The code-point offset (0-based) into the text of the word it belongs
    #: to, or -1 for a pause before the first word.
    textPosition: int


@dataclass(frozen=True)
class Synthesis:
    """A sentence spoken by espeak-ng, with its phonemes' positions."""

    samples: NDArray[numpy.int16]
    rate: int
    phonemes: tuple[Phoneme, ...]


class EspeakUnavailable(Exception):
    """
    libespeak-ng could not be loaded or started (Debian: C{libespeak-ng1}
    and C{espeak-ng-data}).
    """


class _Library:
    """The loaded library and the state of the synthesis under way."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as error:
            raise EspeakUnavailable(f"cannot load {name}: {error}") from error
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        self.lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.c_int,
            ctypes.c_int,
        ]
        self.lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        self.rate = self.lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS,
            200,
            None,
            _PHONEME_EVENTS | _PHONEME_IPA | _DONT_EXIT,
        )
        if self.rate <= 0:
            raise EspeakUnavailable("espeak_Initialize failed (is espeak-ng-data there?)")
        self.chunks: list[bytes] = []
        self.phonemes: list[Phoneme] = []
        self.word = -1
        # Kept referenced: the library calls it for as long as it lives.
        self.callback = _CALLBACK(self.received)
        self.lib.espeak_SetSynthCallback(self.callback)
        self.voice: bytes | None = None

    def received(self, wav: Any, count: int, events: Any) -> int:
        """The library's callback: keep the audio and the events."""
        if count > 0:
            self.chunks.append(ctypes.string_at(wav, count * 2))
        index = 0
        while True:
            event = events[index]
            if event.type == _LIST_TERMINATED:
                break
            if event.type == _WORD:
                self.word = event.text_position - 1
            elif event.type == _PHONEME:
                raw = bytes(event.id.string).split(b"\0", 1)[0]
                name = raw.decode("utf-8", "replace")
                self.phonemes.append(Phoneme(event.sample, name, self.word))
            index += 1
        return 0

    def hasVoice(self, voice: str) -> bool:
        return self.lib.espeak_SetVoiceByName(voice.encode("ascii")) == 0

    def phonemeCounts(self, words: list[str], voice: str) -> list[int]:
        if self.lib.espeak_SetVoiceByName(voice.encode("ascii")) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}")
        counts = []
        for word in words:
            buffer = ctypes.c_char_p(_encoded(word))
            pointer = ctypes.pointer(buffer)
            names: list[str] = []
            # One clause a call; the pointer moves on, and is NULL at the end.
            while pointer.contents.value:
                found = self.lib.espeak_TextToPhonemes(pointer, _CHARS_UTF8, _IPA_SEPARATED)
                names.extend((found or b"").decode("utf-8", "replace").replace(" ", "_").split("_"))
            counts.append(sum(1 for name in names if name.strip()))
        return counts

    def synthesize(self, text: str, voice: str, rate: int, pitch: int, range: int) -> Synthesis:
        if self.lib.espeak_SetVoiceByName(voice.encode("ascii")) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}")
        self.lib.espeak_SetParameter(_RATE, rate, 0)
        self.lib.espeak_SetParameter(_PITCH, pitch, 0)
        self.lib.espeak_SetParameter(_RANGE, range, 0)
        self.chunks = []
        self.phonemes = []
        self.word = -1
        encoded = _encoded(text)
        buffer = ctypes.create_string_buffer(encoded)
        self.lib.espeak_Synth(
            buffer, len(encoded) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
        )
        samples = numpy.frombuffer(b"".join(self.chunks), dtype=numpy.int16).copy()
        return Synthesis(samples, self.rate, tuple(self.phonemes))


def _encoded(text: str) -> bytes:
    """
    C{text} as the library takes it: UTF-8, one character for one, so that
    its events' character positions stay the text's (a lone surrogate, which
    UTF-8 cannot carry, becomes "?"; a NUL, which would end the C string, a
    space).
    """
    return text.replace("\x00", " ").encode("utf-8", "replace")


_library: _Library | None = None
_failure: EspeakUnavailable | None = None


def _loaded() -> _Library:
    """The library, loaded once; call with L{LOCK} held."""
    global _library, _failure
    if _library is None:
        if _failure is not None:
            raise _failure
        try:
            _library = _Library()
        except EspeakUnavailable as error:
            _failure = error
            raise
    return _library


def available() -> bool:
    """Whether libespeak-ng is there and starts."""
    with LOCK:
        try:
            _loaded()
        except EspeakUnavailable:
            return False
    return True


def hasVoice(voice: str) -> bool:
    """Whether espeak-ng has this voice (C{"en-us"}, C{"de"}, C{"en-us+f3"})."""
    with LOCK:
        try:
            return _loaded().hasVoice(voice)
        except EspeakUnavailable:
            return False


def phonemeCounts(words: list[str], voice: str) -> list[int]:
    """
    How many phonemes espeak-ng reads in each word, read alone: to share
    out the phonemes of words a synthesis joined into one (espeak-ng speaks
    "from the" as one word, with one word event).

    @raise EspeakUnavailable: the library is not there.
    @raise ValueError: espeak-ng has no such voice.
    """
    with LOCK:
        return _loaded().phonemeCounts(words, voice)


def synthesize(
    text: str, voice: str, rate: int = 175, pitch: int = 50, range: int = 50
) -> Synthesis:
    """
    Speak C{text} (plain text, no markup) with an espeak-ng voice at C{rate}
    words a minute and C{pitch} and C{range} (0..100).

    @raise EspeakUnavailable: the library is not there.
    @raise ValueError: espeak-ng has no such voice.
    """
    with LOCK:
        return _loaded().synthesize(text, voice, rate, pitch, range)
