"""
The console's twisted.web resources: a fixed set of static files shipped in
the package, and a guard that serves them only to requests addressed to a
loopback name.

The guard is against DNS rebinding: a web page at C{http://evil.example:PORT}
whose name is made to resolve to 127.0.0.1 would reach this listener with
C{Host: evil.example:PORT}.  Such a page could not open C{/client/socket}
anyway (its origin is not allowed there), but it should not read the
console or C{/metrics} either.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from importlib import resources
from typing import Any

from twisted.web import pages
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request

#: Files under C{/console/}: name -> (package, path inside it, content type).
FILES: dict[bytes, tuple[str, str, bytes]] = {
    b"console.css": ("rpmiddleware.console", "static/console.css", b"text/css; charset=utf-8"),
    b"app.js": ("rpmiddleware.console", "static/app.js", b"text/javascript; charset=utf-8"),
    b"socket.js": ("rpmiddleware.console", "static/socket.js", b"text/javascript; charset=utf-8"),
    b"status.js": ("rpmiddleware.console", "static/status.js", b"text/javascript; charset=utf-8"),
    b"cards.js": ("rpmiddleware.console", "static/cards.js", b"text/javascript; charset=utf-8"),
    b"player.js": ("rpmiddleware.console", "static/player.js", b"text/javascript; charset=utf-8"),
    b"face.js": ("rpmiddleware.console", "static/face.js", b"text/javascript; charset=utf-8"),
    b"mic.js": ("rpmiddleware.console", "static/mic.js", b"text/javascript; charset=utf-8"),
    b"favicon.svg": ("rpmiddleware.console", "static/favicon.svg", b"image/svg+xml"),
    b"example-card.json": (
        "rpmiddleware",
        "data/example_character.json",
        b"application/json; charset=utf-8",
    ),
}
INDEX = ("rpmiddleware.console", "static/index.html", b"text/html; charset=utf-8")


def loopbackHost(host: bytes | None) -> bool:
    """
    Whether a C{Host} header names this machine's loopback: C{localhost},
    127.0.0.0/8 or C{[::1]}, with any port.  A missing header (HTTP/1.0; no
    browser sends none) is let through.
    """
    if host is None:
        return True
    try:
        text = host.decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return False
    if text.startswith("["):
        name = text[1 : text.find("]")] if "]" in text else ""
    else:
        name = text.rsplit(":", 1)[0] if text.count(":") == 1 else text
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class LoopbackOnly(Resource):
    """
    Serves C{wrapped} (and its children) only to requests whose C{Host} is a
    loopback name; others get 403 with a sentence.
    """

    def __init__(self, wrapped: Resource) -> None:
        super().__init__()
        self.wrapped = wrapped
        self.isLeaf = wrapped.isLeaf

    def getChildWithDefault(self, path: bytes, request: Request) -> Any:
        return LoopbackOnly(self.wrapped.getChildWithDefault(path, request))

    def render(self, request: Request) -> Any:
        if not loopbackHost(request.getHeader(b"host")):
            page = pages.forbidden(
                "Forbidden",
                "The console answers only requests addressed to 127.0.0.1 or localhost.",
            )
            return page.render(request)
        return self.wrapped.render(request)


@dataclass(frozen=True)
class _File:
    package: str
    path: str
    contentType: bytes

    def read(self) -> bytes:
        return resources.files(self.package).joinpath(self.path).read_bytes()


def _securityHeaders(request: Request) -> None:
    request.setHeader(b"x-content-type-options", b"nosniff")
    request.setHeader(b"x-frame-options", b"DENY")
    request.setHeader(b"referrer-policy", b"no-referrer")
    request.setHeader(b"cache-control", b"no-cache")


class StaticFile(Resource):
    """
    One shipped file, read once.
    """

    isLeaf = True

    def __init__(self, package: str, path: str, contentType: bytes) -> None:
        super().__init__()
        self.file = _File(package, path, contentType)
        self._body: bytes | None = None

    def body(self) -> bytes:
        if self._body is None:
            self._body = self.file.read()
        return self._body

    def render_GET(self, request: Request) -> bytes:
        _securityHeaders(request)
        request.setHeader(b"content-type", self.file.contentType)
        return self.body()

    def render_HEAD(self, request: Request) -> bytes:
        return self.render_GET(request)


class IndexPage(StaticFile):
    """
    The page itself, with a Content-Security-Policy that lets it load only
    its own files and talk only to this listener.
    """

    def __init__(self) -> None:
        super().__init__(*INDEX)

    def render_GET(self, request: Request) -> bytes:
        host = (request.getHeader(b"host") or b"127.0.0.1").decode("ascii", "replace")
        policy = (
            "default-src 'self'; script-src 'self'; style-src 'self'; "
            f"connect-src 'self' ws://{host}; img-src 'self' data: blob:; "
            "media-src 'self' blob:; object-src 'none'; base-uri 'none'; "
            "form-action 'none'; frame-ancestors 'none'"
        )
        request.setHeader(b"content-security-policy", policy.encode("ascii", "replace"))
        return super().render_GET(request)


class StaticDirectory(Resource):
    """
    C{/console/NAME} for the names in L{FILES}; 404 for anything else (no
    listing, no path from the request ever reaches the file system).
    """

    def __init__(self) -> None:
        super().__init__()
        for name, (package, path, contentType) in FILES.items():
            self.putChild(name, StaticFile(package, path, contentType))

    def getChild(self, path: bytes, request: Request) -> IResource:
        return pages.notFound("No Such Resource", "No such console file.")

    def render(self, request: Request) -> Any:
        return pages.notFound("No Such Resource", "No such console file.").render(request)
