"""
What RPEngine refuses, checked before an envelope leaves.

RPEngine's core reads every game envelope with one set of rules
(C{crates/rp-engine-core/src/json_core.rs}, C{validate_envelope_value}, and
C{text.rs}, C{parse_response_processing}) and answers anything that breaks
them with C{request.error} C{invalid_payload} that names neither the request
nor the message, and no ack.  A refusal like that cannot be tied to a turn by
its fields, only by its place in the order of answers; so the middleware
checks the same rules first, and a turn that would be refused ends at once
with an error that names the field.

These are our own words for RPEngine's rules (the facts: field names,
shapes, limits), not its code.  They are written out rather than declared as
schemas (L{rpmiddleware.protocol.schema}): almost every rule is across fields or
RPEngine's own semantics (the prompt fields go together, audio output needs
a voice and the model, a card transfer's fields depend on its mode, a regex
Rust would refuse), and each refusal must name the field and say it as
RPEngine's rule does, in the order RPEngine checks.  The simulated RPEngine in
L{rpmiddleware.testing} applies them too, as RPEngine does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from rpmiddleware.cards.validation import InvalidCard, validateCard
from rpmiddleware.protocol.envelope import PROTOCOL, PROTOCOL_VERSION
from rpmiddleware.protocol.messages import (
    AUDIO_INPUT_LANGUAGES,
    MAX_MESSAGE_BYTES,
    SPEECH_MODEL,
    WITHDRAWING,
)

__all__ = ["MAX_MESSAGE_BYTES", "EngineRefusal", "checkEnvelope", "checkOutgoing"]
AUDIO_PROCESSING_PROFILES = ("narrowband_voice", "cinematic_radio")
INTERACTION_MODES = ("auto_event", "direct_user")
#: The three prompt-context fields travel together or not at all.
PROMPT_CONTEXT_FIELDS = ("interactionMode", "promptScene", "promptDirective")
PROMPT_SCENE_TEXT_FIELDS = ("kind", "family", "label", "sceneLine")
PROMPT_DIRECTIVE_TEXT_FIELDS = ("sceneContext", "autoEventGuide", "directUserGuide")
SILENCE_BEHAVIORS = ("error", "restart")

# text.rs: the limits of buffered response processing.
MAX_RESPONSE_RULES = 8
MAX_RESPONSE_PATTERN_BYTES = 1024
MAX_RESPONSE_CAPTURE_GROUPS = 16
RESPONSE_OCCURRENCES = ("first", "last", "all")
RESPONSE_REMOVALS = ("match", "capture", "none")
RESPONSE_TARGETS = ("text", "audio")
_RULE_ID = re.compile(r"[a-z][a-z0-9_.-]{0,63}\Z")
#: Constructs Rust's regex crate refuses that Python's would take:
#: lookaround, back-references, atomic groups, conditionals, \Z.
_RUST_UNSUPPORTED = re.compile(r"\(\?<?[=!]|\\[1-9]|\(\?P=|\(\?>|\(\?\(|\\Z")

#: Types whose requestId RPEngine requires.
_REQUEST_TYPES = ("reply.request", "voice.capture.start")


class EngineRefusal(ValueError):
    """
    An envelope RPEngine would refuse.  C{field} names the culprit (a dotted
    path such as C{promptScene.priority}); C{code} is what RPEngine would
    answer (C{invalid_payload}, or C{invalid_character_card} for a card).
    """

    def __init__(self, field: str, problem: str, code: str = "invalid_payload") -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem
        self.code = code


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _requireText(fields: Mapping[str, Any], names: tuple[str, ...], prefix: str = "") -> None:
    for name in names:
        if not _text(fields.get(name)):
            raise EngineRefusal(prefix + name, "must be a non-empty string")


def checkEnvelope(fields: Mapping[str, Any]) -> None:
    """
    Check one game-to-RPEngine envelope as RPEngine reads it.

    @raise EngineRefusal: naming the first field RPEngine would refuse.
    """
    if fields.get("protocol") != PROTOCOL:
        raise EngineRefusal("protocol", f"must be {PROTOCOL!r}")
    version = fields.get("protocolVersion")
    if not (type(version) is int and version == PROTOCOL_VERSION):
        raise EngineRefusal("protocolVersion", f"must be the integer {PROTOCOL_VERSION}")
    _requireText(fields, ("type", "messageId", "timestamp"))
    kind = fields["type"]
    if kind == "character.sync":
        _requireText(fields, ("integrationId", "characterId"))
        checkCardTransfer(fields.get("card"))
    elif kind in _REQUEST_TYPES:
        _requireText(fields, ("requestId", "eventId", "integrationId", "characterId"))
        if kind == "reply.request":
            checkEvent(fields.get("event"))
        else:
            returnTranscript = fields.get("returnTranscript")
            if "returnTranscript" in fields and not isinstance(returnTranscript, bool):
                raise EngineRefusal("returnTranscript", "must be a boolean")
            if "silenceBehavior" in fields and fields["silenceBehavior"] not in SILENCE_BEHAVIORS:
                raise EngineRefusal("silenceBehavior", 'must be "error" or "restart"')
        checkOutput(fields.get("output"))
        checkCardTransfer(fields.get("card"))
        checkPromptContext(fields)
    elif kind in WITHDRAWING:
        _requireText(fields, ("requestId",))


def checkOutgoing(fields: Mapping[str, Any]) -> None:
    """
    Check an envelope about to leave the chain toward RPEngine, as the
    engine link does before it sends one: L{checkEnvelope}, with the head
    fields the session stamps later (C{messageId}, C{timestamp}) not judged
    yet, and a snapshot card transfer's card read as RPEngine reads it.

    @raise EngineRefusal: naming the first field RPEngine would refuse.
    """
    checkEnvelope({**fields, "messageId": fields.get("messageId") or "-", "timestamp": "-"})
    transfer = fields.get("card")
    if isinstance(transfer, dict) and transfer.get("mode") == "snapshot":
        try:
            validateCard(transfer.get("snapshot"))
        except InvalidCard as e:
            raise EngineRefusal(f"card.snapshot.{e.field}", e.problem, "invalid_character_card")


def checkEvent(event: Any) -> None:
    """
    C{event} of a C{reply.request}: words, 16 kHz mono PCM, or both.
    """
    if not isinstance(event, Mapping):
        raise EngineRefusal("event", "must be an object with text, audio or both")
    text = event.get("text")
    audio = event.get("audio")
    if not isinstance(audio, Mapping) and not (isinstance(text, str) and text.strip()):
        raise EngineRefusal("event", "needs non-blank text or audio")
    if "text" in event and not isinstance(text, str):
        raise EngineRefusal("event.text", "must be a string")
    if not isinstance(audio, Mapping):
        return
    if audio.get("format") not in ("pcm_s16le", "pcm_f32le"):
        raise EngineRefusal("event.audio.format", 'must be "pcm_s16le" or "pcm_f32le"')
    rate, channels = audio.get("sampleRate"), audio.get("channels")
    if type(rate) is not int or rate != 16000 or type(channels) is not int or channels != 1:
        raise EngineRefusal("event.audio", "must be 16 kHz mono PCM (sampleRate 16000, channels 1)")
    if not _text(audio.get("data")):
        raise EngineRefusal("event.audio.data", "must be non-empty base64")
    if "language" in audio and audio["language"] not in AUDIO_INPUT_LANGUAGES:
        raise EngineRefusal(
            "event.audio.language",
            f"must be one of {', '.join(sorted(AUDIO_INPUT_LANGUAGES))} (Moonshine's languages)",
        )


def checkOutput(output: Any) -> None:
    """
    C{output}: the modalities, the language, the voice, response processing.
    """
    if not isinstance(output, Mapping):
        raise EngineRefusal("output", "must be an object")
    modalities = output.get("modalities")
    if (
        not isinstance(modalities, list)
        or "text" not in modalities
        or any(m not in ("text", "audio") for m in modalities)
    ):
        raise EngineRefusal("output.modalities", 'must include "text" and may include "audio"')
    if len(set(modalities)) != len(modalities):
        raise EngineRefusal("output.modalities", "must not repeat a modality")
    if "audio" in modalities:
        audio = output.get("audio")
        if not isinstance(audio, Mapping):
            raise EngineRefusal("output.audio", "must be an object when audio is asked for")
        if audio.get("model") != SPEECH_MODEL:
            raise EngineRefusal("output.audio.model", f"must be {SPEECH_MODEL!r}")
        voice = audio.get("voice")
        if not (isinstance(voice, str) and voice.strip()):
            raise EngineRefusal("output.audio.voice", "must be a non-empty string")
        if "format" in audio and audio["format"] != "pcm_s16le":
            raise EngineRefusal("output.audio.format", 'must be "pcm_s16le"')
        if "processing" in audio:
            processing = audio["processing"]
            if not isinstance(processing, Mapping):
                raise EngineRefusal("output.audio.processing", "must be an object")
            if processing.get("profile") not in AUDIO_PROCESSING_PROFILES:
                raise EngineRefusal(
                    "output.audio.processing.profile",
                    f"must be one of {', '.join(AUDIO_PROCESSING_PROFILES)}",
                )
    elif "audio" in output:
        raise EngineRefusal("output.audio", 'is only allowed with the "audio" modality')
    language = output.get("language")
    if not (isinstance(language, str) and language.strip()):
        raise EngineRefusal("output.language", "is required")
    if "responseProcessing" in output:
        checkResponseProcessing(output["responseProcessing"])


def checkResponseProcessing(processing: Any) -> None:
    """
    C{output.responseProcessing}: buffered regular-expression rules.

    Rust's regex syntax is close to Python's but not the same: a pattern
    Python cannot compile is left for RPEngine to judge, and lookaround and
    back-references, which Rust refuses, are refused here.
    """
    where = "output.responseProcessing"
    if not isinstance(processing, Mapping):
        raise EngineRefusal(where, "must be an object")
    if processing.get("mode") != "buffered":
        raise EngineRefusal(f"{where}.mode", 'must be "buffered"')
    rules = processing.get("rules")
    if not isinstance(rules, list):
        raise EngineRefusal(f"{where}.rules", "must be an array")
    if not 1 <= len(rules) <= MAX_RESPONSE_RULES:
        raise EngineRefusal(f"{where}.rules", f"must hold 1 to {MAX_RESPONSE_RULES} rules")
    seen: set[str] = set()
    for index, rule in enumerate(rules):
        at = f"{where}.rules[{index}]"
        if not isinstance(rule, Mapping):
            raise EngineRefusal(at, "must be an object")
        ruleId = rule.get("id")
        if not isinstance(ruleId, str) or not _RULE_ID.match(ruleId):
            raise EngineRefusal(f"{at}.id", "must match ^[a-z][a-z0-9_.-]{0,63}$")
        if ruleId in seen:
            raise EngineRefusal(f"{at}.id", f"repeats the rule id {ruleId!r}")
        seen.add(ruleId)
        groups = _checkMatcher(rule.get("matcher"), f"{at}.matcher")
        group = rule.get("captureGroup")
        if type(group) is not int or group < 0:
            raise EngineRefusal(f"{at}.captureGroup", "must be a non-negative integer")
        if groups is not None and group > groups:
            raise EngineRefusal(
                f"{at}.captureGroup", f"names group {group}; the pattern has {groups}"
            )
        if rule.get("occurrence") not in RESPONSE_OCCURRENCES:
            raise EngineRefusal(f"{at}.occurrence", "must be first, last or all")
        removal = rule.get("remove")
        if removal not in RESPONSE_REMOVALS:
            raise EngineRefusal(f"{at}.remove", "must be match, capture or none")
        targets = rule.get("removeFrom")
        if not isinstance(targets, list) or any(t not in RESPONSE_TARGETS for t in targets):
            raise EngineRefusal(f"{at}.removeFrom", "must be an array of text and audio")
        if len(set(targets)) != len(targets):
            raise EngineRefusal(f"{at}.removeFrom", "must not repeat a target")
        if removal == "none" and targets:
            raise EngineRefusal(f"{at}.removeFrom", 'must be empty when remove is "none"')


def _checkMatcher(matcher: Any, at: str) -> int | None:
    """
    Check a rule's matcher; the number of capture groups when Python can
    count them.
    """
    if not isinstance(matcher, Mapping):
        raise EngineRefusal(at, "must be an object")
    if matcher.get("type") != "regex":
        raise EngineRefusal(f"{at}.type", 'must be "regex"')
    pattern = matcher.get("pattern")
    if not isinstance(pattern, str) or not 1 <= len(pattern.encode()) <= MAX_RESPONSE_PATTERN_BYTES:
        raise EngineRefusal(
            f"{at}.pattern", f"must be a string of 1 to {MAX_RESPONSE_PATTERN_BYTES} bytes"
        )
    if "flags" in matcher:
        flags = matcher["flags"]
        if not isinstance(flags, str) or any(f not in "ims" for f in flags):
            raise EngineRefusal(f"{at}.flags", "may only contain i, m and s")
        if len(set(flags)) != len(flags):
            raise EngineRefusal(f"{at}.flags", "must not repeat a flag")
    if _RUST_UNSUPPORTED.search(pattern):
        raise EngineRefusal(
            f"{at}.pattern",
            "uses syntax RPEngine's regex (Rust) refuses: lookaround, a back-reference, "
            "an atomic group, a conditional or \\Z",
        )
    try:
        groups = re.compile(pattern).groups
    except (re.error, RecursionError, OverflowError):
        return None
    if groups > MAX_RESPONSE_CAPTURE_GROUPS:
        raise EngineRefusal(
            f"{at}.pattern", f"has {groups} capture groups; at most {MAX_RESPONSE_CAPTURE_GROUPS}"
        )
    return groups


def checkPromptContext(fields: Mapping[str, Any]) -> None:
    """
    C{interactionMode}, C{promptScene} and C{promptDirective}: all three in
    RPEngine's shapes, or none.
    """
    present = [name for name in PROMPT_CONTEXT_FIELDS if name in fields]
    if not present:
        return
    if len(present) != len(PROMPT_CONTEXT_FIELDS):
        missing = [name for name in PROMPT_CONTEXT_FIELDS if name not in fields]
        raise EngineRefusal(
            missing[0], "is missing: interactionMode, promptScene and promptDirective go together"
        )
    if fields["interactionMode"] not in INTERACTION_MODES:
        raise EngineRefusal("interactionMode", 'must be "auto_event" or "direct_user"')
    scene = fields["promptScene"]
    if not isinstance(scene, Mapping):
        raise EngineRefusal("promptScene", "must be an object")
    _requireText(scene, PROMPT_SCENE_TEXT_FIELDS, "promptScene.")
    priority = scene.get("priority")
    if not (_number(priority) and math.isfinite(float(priority or 0))):
        raise EngineRefusal("promptScene.priority", "must be a finite number")
    directive = fields["promptDirective"]
    if not isinstance(directive, Mapping):
        raise EngineRefusal("promptDirective", "must be an object")
    version = directive.get("protocolVersion")
    if type(version) is not int or version < 1:
        raise EngineRefusal("promptDirective.protocolVersion", "must be a positive integer")
    _requireText(directive, PROMPT_DIRECTIVE_TEXT_FIELDS, "promptDirective.")
    if "promptVersion" in directive:
        promptVersion = directive["promptVersion"]
        if not (isinstance(promptVersion, str) and promptVersion.strip()):
            raise EngineRefusal("promptDirective.promptVersion", "must be a non-empty string")


def checkCardTransfer(transfer: Any) -> None:
    """
    The C{card} transfer descriptor's shape (the document itself is checked
    by L{rpmiddleware.cards.validation.validateCard} when RPEngine resolves it).
    """
    if not isinstance(transfer, Mapping):
        raise EngineRefusal("card", "must be a transfer descriptor object")
    if transfer.get("format") != "chara_card_v2":
        raise EngineRefusal("card.format", 'must be "chara_card_v2"')
    mode = transfer.get("mode")
    if mode not in ("snapshot", "patch", "reference"):
        raise EngineRefusal("card.mode", "must be snapshot, patch or reference")
    if mode == "snapshot" and not isinstance(transfer.get("snapshot"), Mapping):
        raise EngineRefusal("card.snapshot", "must hold the card document")
    if mode != "snapshot":
        _requireText(transfer, ("targetHash",), "card.")
    if mode == "patch":
        _requireText(transfer, ("baseHash",), "card.")
        if not isinstance(transfer.get("patch"), list):
            raise EngineRefusal("card.patch", "must be an array of RFC 6902 operations")
