"""
RFC 8785 canonical JSON, fast for the kind of JSON character cards are.

C{rfc8785.dumps} is pure Python: about 11 ms for a 200 KB card, on the
reactor's thread or holding the GIL in a worker thread either way.  For JSON
made only of objects whose keys sort the same by UTF-16 code unit as by code
point, arrays, strings, booleans, null and integers of magnitude below 2**53 --
every Character Card V2 we have seen -- the C C{json} encoder with sorted keys,
compact separators and C{ensure_ascii=False} writes exactly the bytes RFC 8785
asks for (the same escapes, lowercase C{\\u00xx}, UTF-8).  One walk (about
1 ms for 200 KB) decides whether a document is of that kind; anything else
(floats, whose ECMAScript spelling differs from Python's, keys beyond
U+D7FF, large integers, tuples and subclasses) goes to C{rfc8785}, so the
result is always RFC 8785.  C{tests/test_canonical.py} holds the two to the
same bytes with hypothesis.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import rfc8785

#: RFC 8785 takes integers only while an IEEE 754 double holds them exactly.
_INT_LIMIT = 2**53
#: Keys below this character sort the same by code point and by UTF-16 code unit.
_KEY_LIMIT = "\ud800"

_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def _plain(value: Any) -> bool:
    """
    Whether the C encoder writes C{value} as RFC 8785 would.
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
        return -_INT_LIMIT < value < _INT_LIMIT
    return False


def isPlain(document: Any) -> bool:
    """
    Whether the C encoder writes C{document} as RFC 8785 would.
    """
    # A dict subclass at the top (an owned card) is written as a dict by both
    # encoders; only the walk insists on exact types.
    return _plain(dict(document) if isinstance(document, dict) else document)


def sortedJson(document: Any) -> str:
    """
    C{document} as compact JSON with sorted keys, from the C encoder: its
    RFC 8785 canonical form when L{isPlain}, and the content of anything else.

    @raise TypeError: for what JSON cannot hold; C{ValueError} for NaN,
        infinities and circular references.
    """
    return _encoder.encode(document)


def canonicalHash(document: Any) -> str:
    """
    Lowercase hex SHA-256 over the RFC 8785 canonical JSON of C{document}.
    """
    return hashlib.sha256(canonicalJson(document)).hexdigest()


def plainJson(document: Any) -> bytes | None:
    """
    The RFC 8785 canonical JSON of C{document} from the C encoder, or
    C{None} when the document needs the pure-Python one.
    """
    if not isPlain(document):
        return None
    try:
        return _encoder.encode(document).encode("utf-8")
    except UnicodeEncodeError:
        return None  # a lone surrogate: rfc8785 refuses it in its own words


def knownPlainJson(document: Any) -> bytes:
    """
    L{plainJson} without the walk, for a document made only of parts of
    documents that L{plainJson} accepted (a patched card whose base and
    patch values were): the caller vouches for it.
    """
    return _encoder.encode(document).encode("utf-8")


def canonicalJson(document: Any) -> bytes:
    """
    The RFC 8785 canonical UTF-8 JSON of C{document}.

    @raise rfc8785.CanonicalizationError: (a C{ValueError}) for what RFC 8785
        cannot represent: lone surrogates, integers beyond 2**53, NaN.
    """
    encoded = plainJson(document)
    return rfc8785.dumps(document) if encoded is None else encoded
