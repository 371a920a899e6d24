"""
Client messages: parsing and checking what a client sends, and building what
it receives.

Every problem is an L{InvalidMessage} whose text names the field and what is
wrong with it, because it goes straight back to the client in an C{error}
INVALID_MESSAGE and the person reading it is writing a client.  The session
lives on after any of them.

Unknown fields are ignored (a newer client may send more), except in
C{configure}, where an unknown key is almost always a typo that would
silently change nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Annotated, Any

import msgspec

from rpmiddleware.client.settings import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE
from rpmiddleware.protocol.clienterrors import InvalidMessage
from rpmiddleware.protocol.clientfields import (
    jsonName,
    string,
)
from rpmiddleware.protocol.envelope import jsonBytes, loadJson, loadJsonUtf8
from rpmiddleware.protocol.feelings import FEELING_SOURCES
from rpmiddleware.protocol.messages import AUDIO_INPUT_LANGUAGES, SPEECH_OUTPUT_LANGUAGES, VOICES
from rpmiddleware.protocol.meta import PLAYED_LINE
from rpmiddleware.protocol.rules import (
    AUDIO_PROCESSING_PROFILES,
    INTERACTION_MODES,
    SILENCE_BEHAVIORS,
    EngineRefusal,
    checkResponseProcessing,
)
from rpmiddleware.protocol.schema import SchemaError, conform
from rpmiddleware.protocol.speechmarks import markKinds

#: The version of the voice-client protocol spoken here.
PROTOCOL_VERSION = 1
#: An attachment's alt text longer than this is cut (it becomes prompt text).
MAX_ALT_CHARS = 1000

CLIENT_TYPES = (
    "ping",
    "offer",
    "reconnect",
    "audio",
    "attachments",
    "character",
    "configure",
    "text",
    "cancel",
    "voice-capture",
    "status",
)
VOICE_CAPTURE_ACTIONS = ("start", "stop", "cancel")
MODALITY_CHOICES = (["text"], ["text", "audio"])
CONFIGURE_KEYS = frozenset(
    {
        "output",
        "player",
        "interactionMode",
        "promptScene",
        "promptDirective",
        "inputLanguage",
        "silenceBehavior",
        "bargeIn",
        "feelings",
        "speechMarks",
    }
)
#: What a turn's own C{options} may hold: everything C{configure} takes but
#: C{bargeIn}, which is about how turns follow each other, not about one.
TURN_OPTION_KEYS = CONFIGURE_KEYS - {"bargeIn"}
OUTPUT_KEYS = frozenset(
    {
        "modalities",
        "language",
        "voice",
        "sampleRate",
        "streaming",
        "audioProcessing",
        "responseProcessing",
    }
)
#: Messages that start a turn and may carry C{options} for it alone.
TURN_MESSAGES = ("text", "audio", "voice-capture")


# Reading.


def decodeFrame(
    payload: bytes | str, isBinary: bool, extensions: Collection[str] = ()
) -> dict[str, Any]:
    """
    One WebSocket message (its text, or the bytes of it) as a JSON object
    with a string C{type}: one of the protocol's, or of C{extensions} (the
    types the chain's plugins take, L{rpmiddleware.plugin.clientext}).
    """
    if isBinary:
        raise InvalidMessage("binary frames are not part of the protocol; send JSON text")
    try:
        value = loadJsonUtf8(payload) if isinstance(payload, bytes) else loadJson(payload)
    except UnicodeDecodeError:
        raise InvalidMessage("the message is not valid UTF-8")
    except ValueError as e:
        raise InvalidMessage(f"the message is not valid JSON: {e}")
    except RecursionError:
        raise InvalidMessage("the message is nested too deeply")
    if not isinstance(value, dict):
        raise InvalidMessage(f"a message must be a JSON object, got {jsonName(value)}")
    escapes = _SURROGATE_ESCAPE if isinstance(payload, str) else _SURROGATE_ESCAPE_BYTES
    if escapes.search(payload):  # type: ignore[arg-type]
        wrong = notUnicode(value)
        if wrong is not None:
            raise InvalidMessage(
                f"{wrong} is not valid Unicode text: it holds a lone UTF-16 surrogate "
                "(a character cut in half?)"
            )
    kind = value.get("type")
    if not isinstance(kind, str) or not kind:
        raise InvalidMessage("a message must have a string type")
    if kind not in CLIENT_TYPES and kind not in extensions:
        known = ", ".join((*CLIENT_TYPES, *sorted(extensions)))
        raise InvalidMessage(f"unknown message type {kind[:64]!r} (known: {known})")
    return value


#: A JSON escape of a UTF-16 surrogate (C{\\ud800} to C{\\udfff}): the only
#: way one can reach a decoded message, since UTF-8 cannot carry one.  A
#: message without one is not walked (L{notUnicode}).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")


def notUnicode(value: Any) -> str | None:
    """
    The path (C{text}, C{card.data.name}, C{attachments[0].alt}) of the
    first string in C{value}, key or value, that is not valid Unicode (a
    lone surrogate, which JSON's C{"\\ud800"} decodes to and no store or
    encoder takes), or C{None}.
    """
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return path or "the message"
        elif isinstance(item, dict):
            for key, child in item.items():
                name = f"{path}.{key}" if path else str(key)
                if not key.isascii():
                    try:
                        key.encode("utf-8")
                    except UnicodeEncodeError:
                        return f"a field name in {path or 'the message'}"
                stack.append((child, name))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


#: msgspec's type names as L{jsonName} says them, for schema errors.
_WORDS = {
    "str": "a string",
    "int": "a whole number",
    "float": "a number",
    "bool": "a boolean",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


class Attachment(msgspec.Struct, frozen=True):
    """
    A vision attachment: the seed's C{{data, mimeType?, alt?}}, and the
    schema an C{attachments} array is read with (other fields are ignored).
    """

    data: Annotated[str, msgspec.Meta(min_length=1)]
    mimeType: str | None = None
    alt: str | None = None

    @property
    def usableAlt(self) -> str | None:
        """
        The alt text worth passing to RPEngine as context, cut to size.
        """
        alt = " ".join((self.alt or "").split())
        return alt[:MAX_ALT_CHARS] or None


def attachments(message: Mapping[str, Any], *, required: bool) -> list[Attachment]:
    """
    The C{attachments} array of an C{attachments} or C{audio} message.
    """
    kind = message["type"]
    value = message.get("attachments")
    if value is None:
        if required:
            raise InvalidMessage(f"{kind} needs attachments")
        return []
    try:
        return conform(value, list[Attachment], _WORDS)
    except SchemaError as e:
        problem = e.problem
        where = problem.at(f"{kind}.attachments")
        if problem.field.endswith(".data"):
            # Missing, empty or not a string: one answer that says what it is.
            raise InvalidMessage(
                f"{where} must be a non-empty string (a data URI or URL)"
            ) from None
        raise InvalidMessage(f"{where} {problem.problem}") from None


def voiceAction(message: Mapping[str, Any]) -> str:
    action = string(message, "action")
    if action not in VOICE_CAPTURE_ACTIONS:
        raise InvalidMessage(
            f"voice-capture.action must be one of {', '.join(VOICE_CAPTURE_ACTIONS)}, "
            f"got {action[:32]!r}"
        )
    return action


def configureChanges(message: Mapping[str, Any]) -> dict[str, Any]:
    """
    The settings a C{configure} message changes, all checked before any is
    applied, as a flat mapping (C{modalities}, C{language}, C{voice},
    C{sampleRate}, C{streaming}, C{audioProcessing},
    C{responseProcessing}, C{player}, C{interactionMode}, C{promptScene},
    C{promptDirective}, C{inputLanguage}, C{silenceBehavior}, C{bargeIn}).
    A key given as C{null} resets that setting.

    Voices and languages are checked against the seed's lists here, and
    response-processing rules with RPEngine's own rules, so a bad one is
    refused before anything goes to RPEngine.  The rules that tie several
    fields together (the three prompt fields go together) are checked on the
    configuration they make (L{rpmiddleware.client.sessions.ClientConfig.check}).
    """
    fields = {k: v for k, v in message.items() if k != "type"}
    return settingsChanges(fields, "configure", CONFIGURE_KEYS)


def turnOptions(message: Mapping[str, Any]) -> dict[str, Any]:
    """
    The C{options} of a C{text}, C{audio} or C{voice-capture start}: the
    same settings as C{configure} (not C{bargeIn}) for this turn alone; on
    C{voice-capture}, C{silenceBehavior} may also stand beside C{action}.
    """
    kind = message["type"]
    options = message.get("options")
    if options is None:
        changes: dict[str, Any] = {}
    elif not isinstance(options, dict):
        raise InvalidMessage(f"{kind}.options must be an object, got {jsonName(options)}")
    else:
        changes = settingsChanges(options, f"{kind}.options", TURN_OPTION_KEYS)
    if kind == "voice-capture" and message.get("silenceBehavior") is not None:
        changes["silenceBehavior"] = _silenceBehavior(
            message["silenceBehavior"], f"{kind}.silenceBehavior"
        )
    return changes


#: The keys of a C{played} report: one of them.
PLAYED_KEYS = ("ms", "samples")


def played(message: Mapping[str, Any]) -> dict[str, int | float] | None:
    """
    The optional C{played} of a C{cancel}, or of a C{text}, C{audio} or
    C{voice-capture start} that barges in: how much of the interrupted
    line's speech the player was played, counted from its C{tts-start}:
    C{{ms}} (a number of milliseconds) or C{{samples}} (a whole number, at
    the C{sampleRate} of its C{tts-chunk}s), and optionally C{line}: which
    of the turn's spoken lines (a scene's) was playing, counting its lines'
    C{tts-start}s from 0.  C{None} when absent.
    """
    value = message.get("played")
    if value is None:
        return None
    where = f"{message['type']}.played"
    if not isinstance(value, dict):
        raise InvalidMessage(f"{where} must be an object, got {jsonName(value)}")
    unknown = sorted(k for k in value if k not in (*PLAYED_KEYS, PLAYED_LINE))
    if unknown:
        raise InvalidMessage(f"{where} has unknown field {unknown[0]!r} (known: ms, samples, line)")
    line = value.get(PLAYED_LINE)
    if PLAYED_LINE in value and (type(line) is not int or line < 0):
        raise InvalidMessage(f"{where}.line must be a whole number from 0, got {line!r}")
    given = [k for k in PLAYED_KEYS if k in value]
    if len(given) != 1:
        raise InvalidMessage(f"{where} must have exactly one of ms and samples")
    key = given[0]
    amount = value[key]
    if key == "samples":
        if type(amount) is not int or amount < 0:
            raise InvalidMessage(f"{where}.samples must be a whole number from 0, got {amount!r}")
    elif not isinstance(amount, int | float) or isinstance(amount, bool) or not amount >= 0:
        raise InvalidMessage(f"{where}.ms must be a number from 0, got {amount!r}")
    if line is not None:
        return {key: amount, PLAYED_LINE: line}
    return {key: amount}


def settingsChanges(fields: Mapping[str, Any], where: str, keys: frozenset[str]) -> dict[str, Any]:
    _checkKnown(fields, keys, where)
    changes: dict[str, Any] = {}
    output = fields.get("output")
    if output is not None:
        if not isinstance(output, dict):
            raise InvalidMessage(f"{where}.output must be an object, got {jsonName(output)}")
        _checkKnown(output, OUTPUT_KEYS, f"{where}.output")
        changes.update(_checked(output, _OUTPUT_FIELDS, f"{where}.output"))
    changes.update(_checked(fields, _SETTINGS_FIELDS, where))
    return changes


def _checkKnown(fields: Mapping[str, Any], keys: Collection[str], where: str) -> None:
    """
    Refuse a key not in C{keys}: in settings an unknown key is almost always
    a typo that would silently change nothing.
    """
    unknown = sorted(k for k in fields if k not in keys)
    if unknown:
        raise InvalidMessage(
            f"{where} has unknown field {unknown[0]!r} (known: {', '.join(sorted(keys))})"
        )


def _checked(
    fields: Mapping[str, Any],
    checks: tuple[tuple[str, Callable[[Any, str], Any]], ...],
    where: str,
) -> dict[str, Any]:
    """
    Each field of C{fields} that C{checks} names, checked in C{checks}'
    order (so the first problem reported stays the same) and returned as
    its checker gives it back.
    """
    return {
        name: check(fields[name], f"{where}.{name}") for name, check in checks if name in fields
    }


def _objectOrNull(value: Any, where: str) -> Any:
    if value is not None and not isinstance(value, dict):
        raise InvalidMessage(f"{where} must be an object or null")
    return value


def _boolOrNull(value: Any, where: str) -> Any:
    if value is not None and not isinstance(value, bool):
        raise InvalidMessage(f"{where} must be true, false or null")
    return value


def _player(value: Any, where: str) -> dict[str, Any] | None:
    """
    RPEngine's C{player} object: C{displayName}, the name the character
    calls the player (RPEngine uses "Player" for a blank one: prompt.rs
    C{assemble_prompt_value}).
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidMessage(f"{where} must be an object or null")
    if "displayName" in value and not isinstance(value["displayName"], str):
        raise InvalidMessage(
            f"{where}.displayName must be a string, got {jsonName(value['displayName'])}"
        )
    return value


def _named(value: Any, choices: Collection[str], where: str, what: str) -> Any:
    """
    C{value} if it is null or one of C{choices} (a list or object never is,
    and is unhashable); else L{InvalidMessage} listing the choices.
    """
    if value is None or (isinstance(value, str) and value in choices):
        return value
    raise InvalidMessage(
        f"{where} {_shown(value)} is not {what} (one of {', '.join(sorted(choices))})"
    )


def _oneOf(choices: Collection[str], what: str) -> Callable[[Any, str], Any]:
    """
    A checker for L{_checked}: L{_named} with these C{choices}.
    """
    return lambda value, where: _named(value, choices, where, what)


def _shown(value: Any) -> str:
    return repr(value[:32]) if isinstance(value, str) else jsonName(value)


def _silenceBehavior(value: Any, where: str) -> Any:
    return _named(
        value,
        SILENCE_BEHAVIORS,
        where,
        'what RPEngine does after a silent capture ("error": empty_speech; '
        '"restart": listen again)',
    )


def _modalities(value: Any, where: str) -> list[str] | None:
    if value is not None and value not in MODALITY_CHOICES:
        raise InvalidMessage(f'{where} must be ["text"] or ["text", "audio"]')
    return list(value) if value is not None else None


def _sampleRate(value: Any, where: str) -> Any:
    if value is not None and (
        type(value) is not int or not MIN_SAMPLE_RATE <= value <= MAX_SAMPLE_RATE
    ):
        raise InvalidMessage(
            f"{where} must be a whole number from {MIN_SAMPLE_RATE} "
            f"to {MAX_SAMPLE_RATE}, got {jsonName(value) if type(value) is not int else value}"
        )
    return value


def _responseProcessing(value: Any, where: str) -> Any:
    if value is not None:
        try:
            checkResponseProcessing(value)
        except EngineRefusal as e:
            # e.field is RPEngine's path, which always starts with
            # output.responseProcessing (where ends with it).
            field = e.field.removeprefix("output.responseProcessing")
            raise InvalidMessage(f"{where}{field} {e.problem}") from None
    return value


# The fields of C{output} and of the settings around it, in the order they
# are checked.
_OUTPUT_FIELDS: tuple[tuple[str, Callable[[Any, str], Any]], ...] = (
    ("modalities", _modalities),
    ("language", _oneOf(SPEECH_OUTPUT_LANGUAGES, "a speech-output language of RPEngine")),
    ("voice", _oneOf(VOICES, "a voice of RPEngine")),
    ("sampleRate", _sampleRate),
    ("streaming", _boolOrNull),
    # RPEngine's output.audio.processing.profile.
    (
        "audioProcessing",
        _oneOf(AUDIO_PROCESSING_PROFILES, "an audio processing profile of RPEngine"),
    ),
    ("responseProcessing", _responseProcessing),
)
_SETTINGS_FIELDS: tuple[tuple[str, Callable[[Any, str], Any]], ...] = (
    ("player", _player),
    ("promptScene", _objectOrNull),
    ("promptDirective", _objectOrNull),
    ("interactionMode", _oneOf(INTERACTION_MODES, "an interaction mode of RPEngine")),
    ("inputLanguage", _oneOf(AUDIO_INPUT_LANGUAGES, "a language RPEngine understands in audio")),
    ("silenceBehavior", _silenceBehavior),
    ("bargeIn", _boolOrNull),
    # Read by the feelings plugin (meta "feelings" on the request).
    ("feelings", _oneOf(FEELING_SOURCES, "where feelings come from")),
    # Read by the speech-marks plugin (meta "speechMarks" on the request).
    ("speechMarks", markKinds),
)


# Writing.


def encode(message: Mapping[str, Any]) -> bytes:
    return jsonBytes(message)


def ready(sessionId: str, iceServers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "ready",
        "id": sessionId,
        "protocolVersion": PROTOCOL_VERSION,
        "iceServers": [dict(s) for s in iceServers],
    }


def pong(timestamp: float | int) -> dict[str, Any]:
    return {"type": "pong", "timestamp": timestamp}


def reconnectAck(success: bool, sessionId: str, historyRecovered: bool) -> dict[str, Any]:
    return {
        "type": "reconnect-ack",
        "success": success,
        "sessionId": sessionId,
        "historyRecovered": historyRecovered,
    }


def turnMessage(kind: str, turnId: str | None, **fields: Any) -> dict[str, Any]:
    """
    A message about one turn, carrying its C{turnId} (RPEngine's requestId)
    so that a client can tell a cancelled turn's stragglers from the next.
    """
    message: dict[str, Any] = {"type": kind, **fields}
    if turnId is not None:
        message["turnId"] = turnId
    return message
