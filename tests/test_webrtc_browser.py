"""
A real browser as the voice client: headless Chromium (Debian's package)
driven by Playwright, its fake microphone playing a spoken WAV file.

A page served from a twisted.web server on 127.0.0.1 connects to
/client/socket, offers its data channel, adds the microphone and offers
again, speaks one turn, and receives the character's voice on the track:
getStats shows bytes received and an audio level above zero.

Runs on the asyncio reactor (in a child process from the default suite);
skips with the reason when /usr/bin/chromium or playwright is missing.
Playwright's own browser download (playwright install) is never used.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import Data

from rpmiddleware.client.settings import ClientSettings
from rpmiddleware.config.settings import Settings
from rpmiddleware.testing.kit import exampleCard
from tests.support.client import LiveClientCase, requestsOf
from tests.support.webrtc import AsyncioTestCase, inChildProcess

CHROMIUM = "/usr/bin/chromium"
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "webrtc_page.html")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--use-fake-device-for-media-stream",
    "--use-fake-ui-for-media-stream",
    "--allow-loopback-in-peer-connection",
    # The character's voice plays into an <audio> element nobody clicked.
    "--autoplay-policy=no-user-gesture-required",
]


def browserMissing() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; never playwright install)"
    return None


def runBrowser(pageUrl: str, socketUrl: str, wav: str, waitMs: int) -> dict[str, Any]:
    """
    In a thread of its own (Playwright's sync API runs its own loop): open
    the page in headless Chromium and run one spoken turn.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}"],
        )
        try:
            page = browser.new_page()
            page.goto(pageUrl)
            result: dict[str, Any] = page.evaluate(
                "args => window.runTurn(args)",
                {"url": socketUrl, "character": exampleCard(), "waitMs": waitMs},
            )
            return result
        finally:
            browser.close()


class BrowserTests(AsyncioTestCase, LiveClientCase):
    timeout = 90

    def setUp(self) -> None:
        AsyncioTestCase.setUp(self)
        missing = browserMissing()
        if missing is not None:
            self.skipTest(missing)
        root = Resource()
        with open(PAGE, "rb") as f:
            root.putChild(b"", Data(f.read(), "text/html; charset=utf-8"))
        site: Any = Site(root)
        self.pagePort = reactor.listenTCP(0, site, interface="127.0.0.1")  # type: ignore[attr-defined]
        self.addCleanup(self.pagePort.stopListening)
        address: Any = self.pagePort.getHost()
        self.pageUrl = f"http://127.0.0.1:{address.port}"
        LiveClientCase.setUp(self)

    def configure(self, settings: Settings, client: ClientSettings) -> None:
        settings.server.client_origins.append(self.pageUrl)

    def spokenWav(self) -> str:
        """
        Half a second of silence, a 1.2 s speech-like utterance, then
        silence long enough that Chromium's looping of the file does not
        speak again before the reply is over.
        """
        from rpmiddleware.testing.webrtc import Recording

        recording = Recording([("silence", 0.5), ("speech", 1.2), ("silence", 20.0)])
        folder = tempfile.mkdtemp(prefix="webrtc-browser-")
        self.addCleanup(shutil.rmtree, folder, True)
        path = os.path.join(folder, "spoken.wav")
        with open(path, "wb") as f:
            f.write(recording.wav(rate=48000))
        return path

    @inlineCallbacks
    def test_spokenTurnInChromium(self) -> Any:
        engine = yield self.engine(secondsPerCharacter=0.02)
        result = yield deferToThread(
            runBrowser, self.pageUrl + "/", self.live.url("/client/socket"), self.spokenWav(), 30000
        )
        self.assertEqual(result["errors"], [])
        self.assertEqual(result["answers"], 2)
        for line in result["answerCandidates"]:
            self.assertIn(" 127.0.0.1 ", line)
        # The turn went by voice: detected here, sent to RPEngine as 16 kHz mono.  RPEngine
        # transcribes a recording without telling the words (app.rs stt_completed), so there
        # is no transcript message.
        for kind in ("speech-start", "speech-end", "tts-start", "tts-complete"):
            self.assertIn(kind, result["channel"])
        self.assertNotIn("transcript", result["channel"])
        self.assertNotIn("tts-chunk", result["channel"])
        [request] = requestsOf(engine)
        audio = request["event"]["audio"]
        self.assertEqual((audio["sampleRate"], audio["channels"]), (16000, 1))
        # And the character's voice came back on the track.
        stats = result["stats"]
        self.assertTrue(stats, "no inbound audio stats")
        self.assertGreater(max(s["bytesReceived"] for s in stats), 0)
        self.assertGreater(max(s["audioLevel"] for s in stats), 0)
        self.assertGreater(max(s["totalAudioEnergy"] for s in stats), 0)


BrowserTestsInChild = inChildProcess(__name__, "BrowserTests")
