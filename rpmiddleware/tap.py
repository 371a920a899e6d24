"""
C{twistd rpmiddleware}: command-line options and the service they make.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.application import service
from twisted.python import usage

from rpmiddleware.config.settings import ConfigError, Settings, check, loadSettings


class Options(usage.Options):
    synopsis = "[options]"
    longdesc = (
        "Run rpmiddleware: the loopback WebSocket listener RPEngine connects to, with the "
        "plugin chain and the endpoint for games and voice clients."
    )
    optParameters = [
        ["port", "p", None, "Port to listen on (default 38471, or the config file's).", int],
        ["interface", None, None, "Loopback address to listen on (default 127.0.0.1)."],
        ["config", "c", None, "TOML configuration file."],
        ["origin", None, None, "Also allow this browser origin on /rp-engine/socket."],
        [
            "mailbox",
            None,
            None,
            "Also serve RPEngine's file mailbox in this folder (select it in RPEngine's "
            "settings); created if missing.",
        ],
    ]
    optFlags = [
        ["dev", None, "Development mode: also allow http://127.0.0.1:5173 as RPEngine's origin."],
        [
            "demo",
            None,
            "Connect a simulated RPEngine in-process and play a short scripted conversation, "
            "so you can see replies flow without RPEngine.",
        ],
    ]

    def postOptions(self) -> None:
        try:
            settings = loadSettings(self["config"]) if self["config"] else Settings()
            server = settings.server
            if self["port"] is not None:
                server.port = self["port"]
            if self["interface"] is not None:
                server.interface = self["interface"]
            if self["dev"]:
                server.dev = True
            if self["origin"]:
                server.origins.append(self["origin"])
            if self["mailbox"]:
                settings.engine.mailbox = os.path.abspath(os.path.expanduser(self["mailbox"]))
            check(settings)
        except ConfigError as e:
            raise usage.UsageError(str(e))
        self.settings = settings


def makeService(options: Options, reactor: Any = None) -> service.IService:
    """
    The whole daemon.  The reactor is looked up only now, so that twistd's
    choice (--reactor) is the one used.
    """
    if reactor is None:
        # WebRTC (aiortc) needs the asyncio reactor: chosen here unless
        # --reactor chose another (then logged, and offers are refused).
        from rpmiddleware.webrtc.reactor import chooseDaemonReactor

        chooseDaemonReactor(options.settings)
        from twisted.internet import reactor as installed

        reactor = installed
    import txaio

    from rpmiddleware.daemon.service import makeMiddlewareService
    from rpmiddleware.runtime.collector import freezeWhenRunning

    # Autobahn logs through txaio, whose level defaults to everything; its
    # debug chatter (every frame, every option) would drown our own events.
    txaio.set_global_log_level("info")  # type: ignore[attr-defined]

    if options["demo"]:
        from rpmiddleware.testing.demo import giveDemoCharacter, giveDemoPlaybook

        giveDemoPlaybook(options.settings)
        giveDemoCharacter(options.settings)
    try:
        top, middleware = makeMiddlewareService(reactor, options.settings)
    except ConfigError as e:
        raise SystemExit(f"rpmiddleware: {e}")
    # Start-up's objects out of the collector's later passes (collector.py).
    freezeWhenRunning(reactor)
    if options["demo"]:
        from rpmiddleware.testing.demo import DemoService

        demo = DemoService(reactor, middleware, top, mailbox=bool(options.settings.engine.mailbox))
        demo.setServiceParent(top)
    return top
