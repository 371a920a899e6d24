"""
How the simulated RPEngine reads a frame from the game, before anything else.

RPEngine (crates/rp-engine-core/src/app.rs C{transport_message}) parses each
message as JSON and checks it with json_core.rs C{validate_envelope_value};
anything that fails is answered with C{request.error}
C{{code: "invalid_payload", message}} -- no requestId, no sourceMessageId, no
ack -- and otherwise ignored.  Messages over 8 MiB are refused too
(json_core.rs C{MAX_MESSAGE_BYTES}, docs/protocol-v3.md).  RPEngine does not
check the sessionId, nor refuse unknown types: those are acknowledged and
ignored.

The envelope rules themselves are L{rpmiddleware.protocol.rules.checkEnvelope};
RPEngine's check also compiles every C{output.responseProcessing} pattern
(json_core.rs C{validate_output} calls text.rs
C{parse_response_processing}), so one its regex crate cannot build is
C{invalid_payload} too: L{checkResponseRules} compiles them here (with
L{rpmiddleware.testing.responsetext.rustPattern}; what Rust refuses and
Python would take, lookaround and back-references, protocol.rules refuses
first).  This module adds the frame: size, UTF-8, strict JSON (as serde_json reads
it: no NaN or Infinity, no number too large for a double, no lone
surrogate, nesting at most 128 deep).
"""

from __future__ import annotations

import re
from typing import Any

from rpmiddleware.protocol.envelope import loadJson
from rpmiddleware.protocol.rules import (
    MAX_MESSAGE_BYTES,
    MAX_RESPONSE_CAPTURE_GROUPS,
    EngineRefusal,
    checkEnvelope,
)
from rpmiddleware.testing.responsetext import ResponseProcessing

#: The types whose C{output} RPEngine checks (json_core.rs validate_envelope_value).
_WITH_OUTPUT = ("reply.request", "voice.capture.start")

#: serde_json's default recursion limit.
MAX_NESTING = 128
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


class InvalidPayload(ValueError):
    """
    A frame RPEngine answers with C{invalid_payload}; the message says why.
    """


def _tooDeep(value: Any) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _hasLoneSurrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def checkFields(fields: Any) -> dict[str, Any]:
    """
    A decoded message as an envelope RPEngine accepts.

    @raise InvalidPayload: saying what RPEngine would refuse.
    """
    if not isinstance(fields, dict):
        raise InvalidPayload("the message is not a JSON object")
    try:
        checkEnvelope(fields)
    except EngineRefusal as e:
        raise InvalidPayload(str(e))
    checkResponseRules(fields)
    return fields


def checkResponseRules(fields: dict[str, Any]) -> None:
    """
    Compile a request's response-processing rules as RPEngine's envelope
    check does (text.rs parse_response_processing, whose limits
    L{checkEnvelope} has already applied: 1 to 8 rules, ids
    C{^[a-z][a-z0-9_.-]{0,63}$}, patterns of 1 to 1024 bytes, at most 16
    capture groups, flags of i, m and s).

    @raise InvalidPayload: for a pattern that does not compile, one with
        more than 16 groups, or a capture group it does not have.
    """
    output = fields.get("output")
    if fields.get("type") not in _WITH_OUTPUT or not isinstance(output, dict):
        return
    config = output.get("responseProcessing")
    if config is None:
        return
    try:
        processing = ResponseProcessing.parse(config)
    except ValueError as e:
        raise InvalidPayload(f"Invalid output.responseProcessing: {e}")
    for rule in processing.rules if processing is not None else []:
        if rule.matcher.groups > MAX_RESPONSE_CAPTURE_GROUPS:
            raise InvalidPayload(
                f"responseProcessing regex for {rule.id} has more than "
                f"{MAX_RESPONSE_CAPTURE_GROUPS} capture groups."
            )


def decodeFrame(payload: bytes | str) -> dict[str, Any]:
    """
    A text frame as an envelope RPEngine accepts.

    @raise InvalidPayload: saying what RPEngine would refuse.
    """
    size = len(payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload)
    if size > MAX_MESSAGE_BYTES:
        raise InvalidPayload(f"the message is {size} bytes, over the 8 MiB limit")
    try:
        fields = loadJson(payload)
    except (ValueError, RecursionError) as e:
        raise InvalidPayload(f"the message is not JSON: {e}")
    if _tooDeep(fields):
        raise InvalidPayload(f"the message nests deeper than {MAX_NESTING} levels")
    if _hasLoneSurrogate(fields):
        raise InvalidPayload("the message holds a lone surrogate escape")
    return checkFields(fields)


def ackReference(fields: dict[str, Any]) -> str | None:
    """
    The messageId a game's C{ack} acknowledges, if it names one.
    """
    value = fields.get("acknowledgedMessageId")
    return value if isinstance(value, str) and value else None
