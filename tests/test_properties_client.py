"""
Property tests for what a client can send us: a frame is either a message of
a known type or an L{InvalidMessage} with words for the client, whatever the
bytes; field readers raise nothing else on any JSON value; every well-formed
C{configure} is taken as given; and what we write reads back as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.client import messages
from rpmiddleware.client.messages import (
    CLIENT_TYPES,
    CONFIGURE_KEYS,
    MODALITY_CHOICES,
    OUTPUT_KEYS,
    configureChanges,
    decodeFrame,
)
from rpmiddleware.client.settings import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE
from rpmiddleware.protocol import clientfields
from rpmiddleware.protocol.clienterrors import InvalidMessage
from rpmiddleware.protocol.messages import AUDIO_INPUT_LANGUAGES, SPEECH_OUTPUT_LANGUAGES, VOICES
from rpmiddleware.protocol.rules import (
    AUDIO_PROCESSING_PROFILES,
    INTERACTION_MODES,
    SILENCE_BEHAVIORS,
)
from tests.support.strategies import jsonValues

_FIELD_NAMES = sorted(
    {"text", "data", "action", "sessionId", "timestamp", "attachments", "mimeType"}
    | CONFIGURE_KEYS
    | OUTPUT_KEYS
    | {"options"}
)
#: Objects that look like client messages: a known type, fields of any kind.
clientLike = st.builds(
    lambda kind, fields: {**fields, "type": kind},
    st.sampled_from(CLIENT_TYPES),
    st.dictionaries(st.sampled_from(_FIELD_NAMES) | st.text(max_size=8), jsonValues, max_size=6),
)

#: Text with lone UTF-16 surrogates, which RPEngine may send escaped.  (A
#: high surrogate just before a low one is a pair to any JSON reader, which
#: gives one character back: no peer's text holds such a pair.)
awkwardText = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=12).filter(
    lambda text: re.search("[\ud800-\udbff][\udc00-\udfff]", text) is None
)
writable = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | awkwardText,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(awkwardText, children, max_size=4)
    ),
    max_leaves=20,
)


def _readers(name: str) -> list[tuple[str | None, Callable[[dict[str, Any]], Any]]]:
    """
    Every field reader of L{messages}, pointed at field C{name}, with the
    one message type it is for (C{None}: any).
    """
    return [
        (None, lambda m: clientfields.string(m, name)),
        (None, lambda m: clientfields.string(m, name, empty=True)),
        (None, lambda m: clientfields.identifier(m, name, required=False)),
        (None, lambda m: clientfields.number(m, name)),
        (None, lambda m: clientfields.obj(m, name)),
        (None, lambda m: messages.attachments(m, required=True)),
        (None, lambda m: messages.attachments(m, required=False)),
        ("voice-capture", messages.voiceAction),
        ("configure", configureChanges),
        ("text", messages.turnOptions),
        ("voice-capture", messages.turnOptions),
    ]


class DecodeFrameProperties(SynchronousTestCase):
    @settings(max_examples=200, deadline=None)
    @given(st.binary(max_size=300), st.booleans())
    def test_anyBytes(self, payload: bytes, isBinary: bool) -> None:
        """
        Any bytes at all are a message of a known type or a refusal with
        words, never another exception.
        """
        try:
            message = decodeFrame(payload, isBinary)
        except InvalidMessage as e:
            self.assertTrue(str(e))
        else:
            self.assertFalse(isBinary)
            self.assertIn(message["type"], CLIENT_TYPES)

    @settings(max_examples=200, deadline=None)
    @given(jsonValues | clientLike)
    def test_anyJsonValue(self, value: Any) -> None:
        """
        A JSON value is taken exactly when it is an object with a known
        type, and then comes back as it was sent.
        """
        payload = json.dumps(value).encode("utf-8")
        known = isinstance(value, dict) and value.get("type") in CLIENT_TYPES
        if known:
            self.assertEqual(decodeFrame(payload, False), value)
        else:
            self.assertRaises(InvalidMessage, decodeFrame, payload, False)


class FieldProperties(SynchronousTestCase):
    @settings(max_examples=200, deadline=None)
    @given(clientLike, st.sampled_from(_FIELD_NAMES))
    def test_readersOnlyRefuse(self, message: dict[str, Any], name: str) -> None:
        """
        A field reader given any message either reads it or raises
        L{InvalidMessage} naming the message type.
        """
        for kind, read in _readers(name):
            if kind is not None:
                message = {**message, "type": kind}
            try:
                read(message)
            except InvalidMessage as e:
                self.assertIn(message["type"], str(e))

    @settings(max_examples=200, deadline=None)
    @given(st.data())
    def test_wellFormedConfigure(self, data: st.DataObject) -> None:
        """
        A C{configure} of valid values (or nulls, which reset) changes
        exactly the settings it names, to the values it gives.
        """

        def maybeNull(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
            return st.none() | values

        outputChoices = {
            "modalities": maybeNull(st.sampled_from(MODALITY_CHOICES)),
            "language": maybeNull(st.sampled_from(sorted(SPEECH_OUTPUT_LANGUAGES))),
            "voice": maybeNull(st.sampled_from(sorted(VOICES))),
            "sampleRate": maybeNull(st.integers(MIN_SAMPLE_RATE, MAX_SAMPLE_RATE)),
            "streaming": maybeNull(st.booleans()),
            "audioProcessing": maybeNull(st.sampled_from(AUDIO_PROCESSING_PROFILES)),
        }
        # The shapes inside the prompt objects are RPEngine's to judge, on
        # the configuration they make (ClientConfig.check), not here.
        promptObject = st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3)
        displayName = st.text(max_size=8)
        topChoices = {
            "player": maybeNull(st.fixed_dictionaries({}, optional={"displayName": displayName})),
            "promptScene": maybeNull(promptObject),
            "promptDirective": maybeNull(promptObject),
            "interactionMode": maybeNull(st.sampled_from(INTERACTION_MODES)),
            "inputLanguage": maybeNull(st.sampled_from(sorted(AUDIO_INPUT_LANGUAGES))),
            "silenceBehavior": maybeNull(st.sampled_from(SILENCE_BEHAVIORS)),
            "bargeIn": maybeNull(st.booleans()),
        }
        output = data.draw(st.fixed_dictionaries({}, optional=outputChoices))
        top = data.draw(st.fixed_dictionaries({}, optional=topChoices))
        message: dict[str, Any] = {"type": "configure", **top}
        if output:
            message["output"] = output
        self.assertEqual(configureChanges(message), {**output, **top})

    @settings(max_examples=100, deadline=None)
    @given(st.text(min_size=1, max_size=10).filter(lambda k: k not in CONFIGURE_KEYS | {"type"}))
    def test_unknownConfigureKey(self, key: str) -> None:
        """
        An unknown key (a typo that would change nothing) is refused by name.
        """
        with self.assertRaises(InvalidMessage) as caught:
            configureChanges({"type": "configure", "bargeIn": True, key: 1})
        self.assertIn(repr(key), str(caught.exception))


class EncodeProperties(SynchronousTestCase):
    @settings(max_examples=200, deadline=None)
    @given(st.dictionaries(awkwardText, writable, max_size=5))
    def test_readsBackAsWritten(self, message: dict[str, Any]) -> None:
        """
        Whatever we send a client is valid UTF-8 JSON that reads back as the
        message we wrote, lone surrogates included.
        """
        written = messages.encode(message)
        self.assertEqual(json.loads(written.decode("utf-8")), message)
