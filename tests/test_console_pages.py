"""
The console's pages and its place on the listener: the shipped files, the
loopback Host check, and the page's own origin admitted on /client/socket
(and only there).  The page itself runs in tests/test_console_browser.py.
"""

from __future__ import annotations

from typing import Any

import treq
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.test.requesthelper import DummyRequest

from rpmiddleware.config.settings import Settings
from rpmiddleware.console.pages import (
    FILES,
    INDEX,
    IndexPage,
    LoopbackOnly,
    StaticDirectory,
    loopbackHost,
)
from rpmiddleware.testing.live import connectClient, startMiddleware
from rpmiddleware.testing.memorynet import MemoryNetwork, runOnNetwork
from rpmiddleware.web.websocket import listenerOrigins


class HostTests(SynchronousTestCase):
    def test_loopbackNames(self) -> None:
        for host in (
            b"127.0.0.1:38471",
            b"127.0.0.1",
            b"127.1.2.3:80",
            b"localhost:38471",
            b"LOCALHOST",
            b"[::1]:38471",
            b"[::1]",
            None,
        ):
            self.assertTrue(loopbackHost(host), host)

    def test_otherNames(self) -> None:
        for host in (
            b"evil.example:38471",
            b"localhost.evil.example",
            b"192.168.1.2:38471",
            b"[::2]:38471",
            b"0.0.0.0:38471",
            b"",
            b"\xff",
        ):
            self.assertFalse(loopbackHost(host), host)


def render(resource: Any, host: bytes = b"127.0.0.1:38471") -> tuple[DummyRequest, bytes]:
    request = DummyRequest([b""])
    request.requestHeaders.setRawHeaders(b"host", [host])
    body = resource.render(request)
    return request, b"".join(request.written) if not isinstance(body, bytes) else body


class PageTests(SynchronousTestCase):
    def test_everyFileShipped(self) -> None:
        """
        Every file the console serves is in the package (setup.cfg's
        package_data), and the index names the ones it loads.
        """
        directory = StaticDirectory()
        for name, (_, _, contentType) in FILES.items():
            request, body = render(directory.children[name])
            self.assertTrue(body, name)
            self.assertEqual(
                request.responseHeaders.getRawHeaders(b"content-type"), [contentType], name
            )
            self.assertEqual(
                request.responseHeaders.getRawHeaders(b"x-content-type-options"), [b"nosniff"]
            )
        _, index = render(IndexPage())
        self.assertIn(b'src="/console/app.js"', index)
        self.assertIn(b'href="/console/console.css"', index)
        self.assertEqual(INDEX[2], b"text/html; charset=utf-8")

    def test_unknownFile(self) -> None:
        directory = StaticDirectory()
        request = DummyRequest([b"../pages.py"])
        child = directory.getChildWithDefault(b"..", request)
        child.render(request)
        self.assertEqual(request.responseCode, 404)

    def test_contentSecurityPolicy(self) -> None:
        """
        The page may load only its own files and talk only to this listener.
        """
        request, _ = render(IndexPage(), b"localhost:40000")
        [policy] = request.responseHeaders.getRawHeaders(b"content-security-policy") or [b""]
        self.assertIn(b"script-src 'self'", policy)
        self.assertIn(b"connect-src 'self' ws://localhost:40000", policy)
        self.assertIn(b"frame-ancestors 'none'", policy)

    def test_foreignHostRefused(self) -> None:
        request, body = render(LoopbackOnly(IndexPage()), b"evil.example:38471")
        self.assertEqual(request.responseCode, 403)
        self.assertIn(b"127.0.0.1 or localhost", body)
        self.assertNotIn(b"<script", body)


class ListenerTests(TestCase):
    """
    The console on the listener's site, over HTTP and WebSocket in memory
    on a clock (L{MemoryNetwork}): pages, metrics, and who may open which
    WebSocket.
    """

    def setUp(self) -> None:
        self.network = MemoryNetwork()
        self.live = startMiddleware(self.network.reactor, Settings())
        self.addCleanup(lambda: self.network.run(self.live.stop()))
        self.http = f"http://127.0.0.1:{self.live.port}"

    def runDeferred(self, d: Deferred[Any]) -> Deferred[Any]:
        return self.network.run(d)

    @inlineCallbacks
    def get(self, path: str, **kwargs: Any) -> Any:
        response = yield treq.get(self.http + path, agent=self.network.agent(), **kwargs)
        body = yield response.content()
        return response, body

    @runOnNetwork
    def test_pages(self) -> Any:
        response, body = yield self.get("/")
        self.assertEqual(response.code, 200)
        self.assertIn(b"rpmiddleware console", body)
        response, body = yield self.get("/console/app.js")
        self.assertEqual(
            response.headers.getRawHeaders(b"content-type")[0][:15], b"text/javascript"
        )
        response, body = yield self.get("/metrics")
        self.assertEqual(response.code, 200)
        self.assertIn(b"rpmiddleware_engine_connected 0.0", body)
        response, _ = yield self.get("/nothing/here")
        self.assertEqual(response.code, 404)

    @runOnNetwork
    def test_foreignHost(self) -> Any:
        for path in ("/", "/console/app.js", "/metrics"):
            response, _ = yield self.get(path, headers={"Host": f"evil.example:{self.live.port}"})
            self.assertEqual(response.code, 403, path)

    @runOnNetwork
    def test_consoleOriginAdmitted(self) -> Any:
        """
        A page this listener served (http://127.0.0.1:PORT, or localhost)
        may open /client/socket without being configured.
        """
        self.assertEqual(
            listenerOrigins(self.live.port),
            {
                f"http://127.0.0.1:{self.live.port}",
                f"http://localhost:{self.live.port}",
                f"http://[::1]:{self.live.port}",
            },
        )
        for origin in (f"http://127.0.0.1:{self.live.port}", f"http://LOCALHOST:{self.live.port}/"):
            client = connectClient(
                self.network.reactor, self.live.url("/client/socket"), origin=origin
            )
            self.addCleanup(client.drop)
            yield client.opened
            ready = yield client.next()
            self.assertEqual(ready["type"], "ready")
            yield client.close()

    @runOnNetwork
    def test_otherOriginsRefused(self) -> Any:
        """
        Another port on loopback is another origin: refused on both
        endpoints; and the console's own origin is not RPEngine's.
        """
        other = self.live.port + 1 if self.live.port < 65535 else self.live.port - 1
        attempts = [
            ("/client/socket", f"http://127.0.0.1:{other}"),
            ("/client/socket", f"https://127.0.0.1:{self.live.port}"),
            ("/rp-engine/socket", f"http://127.0.0.1:{other}"),
            ("/rp-engine/socket", f"http://127.0.0.1:{self.live.port}"),
        ]
        for path, origin in attempts:
            client = connectClient(self.network.reactor, self.live.url(path), origin=origin)
            self.addCleanup(client.drop)
            yield self.assertFailure(client.opened, ConnectionError, Exception)
