"""
A card's canonical JSON as RPEngine computes it, fast for the kind of JSON
character cards are.

RPEngine's documentation (docs/character-card-v2-transport.md) says a card's
hash is SHA-256 over its RFC 8785 canonical JSON, but its code -- which is
what players run -- does something else, and only the code decides whether
RPEngine accepts our C{targetHash}.  C{canonical_value} in RPEngine's
C{crates/rp-engine-core/src/json_core.rs} (hashed by C{hash_value} in
C{session.rs}) parses the JSON text it received with C{serde_json} (built
C{--locked} at 1.0.150: C{preserve_order}, neither C{arbitrary_precision}
nor C{float_roundtrip}), then writes arrays and objects itself, object keys
sorted by UTF-16 code unit, no whitespace, and every scalar and key with
C{serde_json::to_string}.  So, unlike RFC 8785:

  - an integer literal that fits C{i64} or C{u64} stays exact and is written
    as its digits (2**60 included); any other number is an C{f64}, read by
    serde_json's fast, not always correctly rounded, decimal conversion and
    written by C{zmij} in ryu's layout with C{e+} for positive exponents:
    C{1.0}, C{-0.0}, C{1e+16}, C{0.00001}, C{1e-6}, C{1.8446744073709552e+19};
  - strings escape only C{"}, C{\\}, \\b \\t \\n \\f \\r and other control
    characters (as lowercase C{\\u00xx}).

What we send is Python's C{json.dumps} of the card (floats as C{repr},
integers as digits), so the canonical form here is that of what serde_json
reads back from that text.  Numbers RPEngine cannot read (NaN, infinities,
literals beyond the range of a double) and lone surrogates, which serde_json
refuses, raise C{ValueError}.

For JSON made only of objects whose keys sort the same by UTF-16 code unit as
by code point, arrays, strings, booleans, null and integers serde_json keeps
exact -- every Character Card V2 we have seen -- the C C{json} encoder with
sorted keys, compact separators and C{ensure_ascii=False} writes exactly these
bytes.  One walk (about 1 ms for 200 KB) decides whether a document is of that
kind; anything else (floats, keys beyond U+D7FF, integers beyond C{i64} and
C{u64}, tuples and subclasses) goes to the pure-Python writer below.
C{tests/test_canonical.py} holds both to vectors produced by serde_json and
to each other.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

#: serde_json keeps an integer literal exact while it fits i64 or u64.
_INT_MIN = -(2**63)
_INT_END = 2**64
_U64_MAX = 2**64 - 1
_I32_MAX = 2**31 - 1
#: Keys below this character sort the same by code point and by UTF-16 code unit.
_KEY_LIMIT = "\ud800"
#: serde_json's table of powers of ten (exact to 1e22, correctly rounded after).
_POW10 = [float(f"1e{n}") for n in range(309)]

_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)
#: serde_json escapes strings as Python's json does with ensure_ascii=False.
_string = json.encoder.encode_basestring


def _plain(value: Any) -> bool:
    """
    Whether the C encoder writes C{value} as RPEngine would.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or max(key) < _KEY_LIMIT):
                return False
            if type(item) is not str and not _plain(item):
                return False
        return True
    if kind is list:
        for item in value:
            if type(item) is not str and not _plain(item):
                return False
        return True
    if kind is int:
        return _INT_MIN <= value < _INT_END
    return False


def isPlain(document: Any) -> bool:
    """
    Whether the C encoder writes C{document} as RPEngine would.
    """
    # A dict subclass at the top (an owned card) is written as a dict by both
    # encoders; only the walk insists on exact types.
    return _plain(dict(document) if isinstance(document, dict) else document)


def sortedJson(document: Any) -> str:
    """
    C{document} as compact JSON with sorted keys, from the C encoder: its
    canonical form when L{isPlain}, and the content of anything else.

    @raise TypeError: for what JSON cannot hold; C{ValueError} for NaN,
        infinities and circular references.
    """
    return _encoder.encode(document)


def canonicalHash(document: Any) -> str:
    """
    Lowercase hex SHA-256 over the canonical JSON of C{document}: the hash
    RPEngine computes for it.
    """
    return hashlib.sha256(canonicalJson(document)).hexdigest()


def plainJson(document: Any) -> bytes | None:
    """
    The canonical JSON of C{document} from the C encoder, or C{None} when
    the document needs the pure-Python writer.
    """
    if not isPlain(document):
        return None
    try:
        return _encoder.encode(document).encode("utf-8")
    except UnicodeEncodeError:
        return None  # a lone surrogate: the pure-Python writer refuses it in words


def knownPlainJson(document: Any) -> bytes:
    """
    L{plainJson} without the walk, for a document made only of parts of
    documents that L{plainJson} accepted (a patched card whose base and
    patch values were): the caller vouches for it.
    """
    return _encoder.encode(document).encode("utf-8")


def canonicalJson(document: Any) -> bytes:
    """
    The canonical UTF-8 JSON of C{document}, as RPEngine writes it for what
    it reads from C{json.dumps(document)}.

    @raise ValueError: for what RPEngine cannot read: NaN, infinities, numbers
        beyond the range of a double, lone surrogates.
    @raise TypeError: for what JSON cannot hold.
    """
    encoded = plainJson(document)
    return _slowJson(document) if encoded is None else encoded


def _slowJson(document: Any) -> bytes:
    """
    The pure-Python writer: read C{json.dumps(document)} as serde_json does
    (L{_serdeNumber}), then write it as RPEngine's C{canonical_value} does.
    """
    # Going through the text settles what json.dumps decides: tuples, key
    # types, subclasses; a key written twice keeps its last value, as in
    # serde_json.
    text = json.dumps(document, ensure_ascii=False)
    value = json.loads(
        text, parse_int=_serdeNumber, parse_float=_serdeNumber, parse_constant=_refuseConstant
    )
    parts: list[str] = []
    _write(value, parts)
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "a string holds a lone surrogate (U+D800..U+DFFF): RPEngine's JSON parser "
            "(serde_json) refuses such text, so RPEngine cannot read it"
        )


def _refuseConstant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number: RPEngine cannot read it")


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _write(value: Any, parts: list[str]) -> None:
    """
    Append the canonical JSON of C{value} (as json.loads with L{_serdeNumber}
    returns it) to C{parts}.
    """
    if type(value) is str:
        parts.append(_string(value))
    elif type(value) is dict:
        parts.append("{")
        for i, key in enumerate(sorted(value, key=_utf16)):
            if i:
                parts.append(",")
            parts.append(_string(key))
            parts.append(":")
            _write(value[key], parts)
        parts.append("}")
    elif type(value) is list:
        parts.append("[")
        for i, item in enumerate(value):
            if i:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    elif type(value) is float:
        parts.append(_formatFloat(value))
    elif value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    else:
        parts.append(str(value))  # an int serde_json keeps exact


def _serdeNumber(literal: str) -> int | float:
    """
    The number serde_json 1.0 (without C{float_roundtrip} or
    C{arbitrary_precision}) reads from a JSON number C{literal}: an C{int}
    when it keeps the literal as C{u64} or C{i64}, else its C{f64}.

    A port of its C{parse_integer}, C{parse_long_integer}, C{parse_decimal},
    C{parse_exponent} and C{f64_from_parts}: decimal digits are gathered into
    a C{u64} (digits past its range are dropped, counting in the exponent
    only in the integer part), which is converted to a double and multiplied
    or divided by a double power of ten.  That is two roundings, so the
    result is not always the double nearest the literal.

    @raise ValueError: where serde_json reports "number out of range".
    """
    text = literal.lower()
    positive = not text.startswith("-")
    mantissa, e, power = text.lstrip("-").partition("e")
    whole, point, fraction = mantissa.partition(".")
    digits = whole + fraction
    if len(digits) <= 19:  # below 10**19: never beyond u64
        significand, exponent, full = int(digits), -len(fraction), False
    else:
        significand, exponent, full = 0, 0, False
        for digit in whole:
            grown = significand * 10 + int(digit)
            if full or grown > _U64_MAX:
                full = True
                exponent += 1
            else:
                significand = grown
        for digit in fraction:
            grown = significand * 10 + int(digit)
            if grown > _U64_MAX:
                break  # serde_json ignores the rest of the fraction
            significand = grown
            exponent -= 1
    if not (point or e or full):
        if positive:
            return significand
        if 0 < significand <= 2**63:
            return -significand
        return -float(significand)  # -0 and beyond i64
    if e:
        negative = power.startswith("-")
        value = int(power.lstrip("+-"))
        if value > _I32_MAX:
            if significand and not negative:
                raise _outOfRange(literal)
            return 0.0 if positive else -0.0
        exponent = exponent - value if negative else exponent + value
        exponent = max(-(2**31), min(_I32_MAX, exponent))  # saturating in i32
    result = float(significand)
    while True:
        if abs(exponent) < len(_POW10):
            if exponent >= 0:
                result *= _POW10[exponent]
                if math.isinf(result):
                    raise _outOfRange(literal)
            else:
                result /= _POW10[-exponent]
            break
        if result == 0.0:
            break
        if exponent >= 0:
            raise _outOfRange(literal)
        result /= 1e308
        exponent += 308
    return result if positive else -result


def _outOfRange(literal: str) -> ValueError:
    return ValueError(
        f"{literal[:40]} is beyond the range of a double: RPEngine's JSON parser "
        "(serde_json) refuses it as out of range"
    )


def _formatFloat(value: float) -> str:
    """
    C{value} as serde_json 1.0.150 writes an C{f64} (C{zmij}, in ryu's
    layout with C{e+} for positive exponents): the shortest digits that read
    back as C{value} (those of C{repr}), in positional notation from 1e-5 up
    to below 1e16 and scientific notation outside it.

    @raise ValueError: for NaN and infinities.
    """
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a JSON number: RPEngine cannot read it")
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    mantissa, _, power = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    # value = 0.<digits> * 10**point
    allDigits = whole + fraction
    significant = allDigits.lstrip("0")
    point = len(whole) - (len(allDigits) - len(significant)) + int(power or 0)
    digits = significant.rstrip("0")
    if len(digits) <= point <= 16:  # 1234e7 -> 12340000000.0
        return f"{sign}{digits}{'0' * (point - len(digits))}.0"
    if 0 < point <= 16:  # 1234e-2 -> 12.34
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -5 < point <= 0:  # 1234e-6 -> 0.001234
        return f"{sign}0.{'0' * -point}{digits}"
    head = digits if len(digits) == 1 else f"{digits[0]}.{digits[1:]}"  # 1e+30, 1.234e-33
    return f"{sign}{head}e{point - 1:+d}"
