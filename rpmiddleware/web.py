"""
The HTTP face of the listener: one twisted.web site on one loopback port,
WebSocket endpoints at their fixed paths and 404 for everything else.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.resource import WebSocketResource
from twisted.web.resource import Resource
from twisted.web.server import Site

ENGINE_PATH = b"/rp-engine/socket"
CLIENT_PATH = b"/client/socket"

#: Seconds an HTTP connection may idle before an upgrade (slowloris guard).
HTTP_TIMEOUT = 30


def _mount(root: Resource, path: bytes, leaf: Resource) -> None:
    parts = path.strip(b"/").split(b"/")
    node = root
    for part in parts[:-1]:
        child = node.children.get(part)
        if child is None:
            child = Resource()
            node.putChild(part, child)
        node = child
    node.putChild(parts[-1], leaf)


def buildSite(endpoints: dict[bytes, Any], pages: dict[bytes, Resource] | None = None) -> Site:
    """
    A site serving each WebSocket factory in C{endpoints} at its path, and
    any C{pages} (the console) beside them.
    """
    root = Resource()
    for path, factory in endpoints.items():
        _mount(root, path, WebSocketResource(factory))  # type: ignore[arg-type]
    for path, page in (pages or {}).items():
        _mount(root, path, page)
    site = Site(root, timeout=HTTP_TIMEOUT)
    site.displayTracebacks = False
    return site
