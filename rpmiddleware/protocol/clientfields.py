"""
Reading the fields of a client message: each check names the message, the
field and what is wrong, in an L{InvalidMessage} that goes back to the client
as C{INVALID_MESSAGE}.  The client endpoint's messages and plugins' own
client messages are read with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpmiddleware.protocol.clienterrors import InvalidMessage

#: The longest identifier (session, character, request ids) a client may send.
MAX_ID_LENGTH = 256


def jsonName(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def requiredField(message: Mapping[str, Any], name: str) -> Any:
    if name not in message or message[name] is None:
        raise InvalidMessage(f"{message['type']} needs {name}")
    return message[name]


def string(message: Mapping[str, Any], name: str, *, empty: bool = False) -> str:
    value = requiredField(message, name)
    if not isinstance(value, str):
        raise InvalidMessage(f"{message['type']}.{name} must be a string, got {jsonName(value)}")
    if not empty and not value.strip():
        raise InvalidMessage(f"{message['type']}.{name} must not be empty")
    return value


def identifier(message: Mapping[str, Any], name: str, *, required: bool = True) -> str | None:
    if not required and message.get(name) is None:
        return None
    value = string(message, name)
    if len(value) > MAX_ID_LENGTH:
        raise InvalidMessage(f"{message['type']}.{name} is longer than {MAX_ID_LENGTH} characters")
    return value


def number(message: Mapping[str, Any], name: str) -> float | int:
    value = requiredField(message, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidMessage(f"{message['type']}.{name} must be a number, got {jsonName(value)}")
    return value


def obj(message: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = requiredField(message, name)
    if not isinstance(value, dict):
        raise InvalidMessage(f"{message['type']}.{name} must be an object, got {jsonName(value)}")
    return value
