"""
Whether WebRTC can run here, and choosing the reactor it runs on.

aiortc is an asyncio library, so WebRTC needs Twisted's asyncio reactor
(L{twisted.internet.asyncioreactor}): the reactor then drives an asyncio loop
and Twisted and aiortc code run on one thread, in one loop.  A reactor is
chosen once per process, by whoever imports C{twisted.internet.reactor} or
calls C{install()} first, so:

  - C{twistd --reactor=asyncio rpmiddleware} chooses it on the command line;
  - C{twistd rpmiddleware} with WebRTC enabled chooses it in
    L{preferAsyncioReactor}, called by the daemon before it first touches the
    reactor;
  - when another reactor is already in place (C{--reactor=epoll}, or an
    embedding program's), nothing crashes: L{preferAsyncioReactor} returns a
    sentence saying what to change, the daemon logs it, and the client
    endpoint answers C{offer} with C{error} WEBRTC_UNAVAILABLE quoting it.

WebRTC is an optional extra (C{pip install "rpmiddleware[webrtc]"}: aiortc and
the voice activity detector); without it L{unavailableReason} says so and
nothing here imports aiortc.

Nothing in this module imports the global reactor at import time.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
from functools import cache
from typing import Any

#: The modules the extra provides, with the distribution that provides each.
REQUIRED_MODULES = (("aiortc", "aiortc"), ("webrtcvad", "webrtcvad-wheels"))

INSTALL_HINT = 'pip install "rpmiddleware[webrtc]"'
ASYNCIO_HINT = "twistd --reactor=asyncio rpmiddleware"


@cache
def unavailableReason() -> str | None:
    """
    C{None} when the WebRTC extra is importable; otherwise a sentence for the
    log and for the client's C{error} message.  Imports aiortc (slow, once),
    frozen out of the collector's passes as start-up's modules are.
    """
    from rpmiddleware.runtime.collector import importFrozen

    for module, distribution in REQUIRED_MODULES:
        try:
            importFrozen(module)
        except ImportError as e:
            return (
                f"WebRTC is not installed on this server ({distribution} is missing: {e}); "
                f"install it with: {INSTALL_HINT}"
            )
    return None


def looksInstalled() -> bool:
    """
    Whether the extra's modules are there, found without importing them:
    aiortc (with PyAV, aioice, cryptography) is about 28 MB of an idle
    daemon's memory, so the daemon imports it at the first C{offer}
    (L{availability}) rather than at start.  A module found but broken is
    told apart only then, by L{unavailableReason}.
    """
    for module, _ in REQUIRED_MODULES:
        try:
            if importlib.util.find_spec(module) is None:
                return False
        except (ImportError, ValueError):
            # ValueError: a module in sys.modules without a spec.
            return False
    return True


def isAsyncioReactor(reactor: Any) -> bool:
    """
    Whether C{reactor} is Twisted's asyncio reactor (or a subclass).
    """
    from twisted.internet.asyncioreactor import AsyncioSelectorReactor

    return isinstance(reactor, AsyncioSelectorReactor)


def eventLoop(reactor: Any) -> asyncio.AbstractEventLoop:
    """
    The asyncio loop the asyncio reactor runs on.

    @raise WrongReactor: when C{reactor} is not the asyncio reactor.
    """
    problem = reactorProblem(reactor)
    if problem is not None:
        raise WrongReactor(problem)
    loop: asyncio.AbstractEventLoop = reactor._asyncioEventloop
    return loop


class WrongReactor(RuntimeError):
    """
    WebRTC was asked for on a reactor that is not Twisted's asyncio reactor.
    """


def reactorName(reactor: Any) -> str:
    return type(reactor).__name__


def reactorProblem(reactor: Any) -> str | None:
    """
    C{None} when C{reactor} can run WebRTC; otherwise why not and what to do.
    """
    if isAsyncioReactor(reactor):
        return None
    return (
        f"WebRTC needs Twisted's asyncio reactor, but this process runs the "
        f"{reactorName(reactor)} reactor; start the daemon with `{ASYNCIO_HINT}` "
        "(or without --reactor, and it picks asyncio itself)"
    )


def installedReactor() -> Any | None:
    """
    The reactor already installed in this process, or C{None}, without
    installing the default one as importing C{twisted.internet.reactor} would.
    """
    return sys.modules.get("twisted.internet.reactor")


def preferAsyncioReactor() -> str | None:
    """
    Make sure the process runs the asyncio reactor, if it still can.

    Installs L{twisted.internet.asyncioreactor} when no reactor is installed
    yet.  Never raises for a reactor already in place.

    @return: C{None} when the asyncio reactor is (now) the process's reactor;
        otherwise a sentence naming the reactor in place and the command line
        that would work.
    """
    installed = installedReactor()
    if installed is None:
        from twisted.internet import asyncioreactor

        try:
            asyncioreactor.install()
        except Exception as e:  # e.g. a reactor installed between our check and now
            installed = installedReactor()
            if installed is None:
                return f"could not install the asyncio reactor: {e}"
        else:
            return None
    return reactorProblem(installed)


def availability(reactor: Any) -> str | None:
    """
    C{None} when WebRTC can be served with C{reactor}; otherwise the reason
    (the extra is missing, or the reactor is not asyncio).
    """
    return unavailableReason() or reactorProblem(reactor)


def chooseDaemonReactor(settings: Any) -> str | None:
    """
    What C{twistd rpmiddleware} calls before it first touches the reactor:
    with WebRTC enabled and installed, make it the asyncio reactor.  Logs
    the outcome in one line.

    @param settings: L{rpmiddleware.config.settings.Settings}.
    @return: C{None} when WebRTC will be served; otherwise why not.
    """
    from twisted.logger import Logger

    log = Logger(namespace="rpmiddleware.webrtc")
    if not settings.webrtc.enabled:
        return "WebRTC is disabled in the configuration (webrtc.enabled = false)"
    # When the extra is missing, unavailableReason's import fails fast and
    # says what is missing; when it is there it is imported at the first
    # offer, not now.
    reason = None if looksInstalled() else unavailableReason()
    if reason is not None:
        log.info("{reason}; offers are answered with WEBRTC_UNAVAILABLE", reason=reason)
        return reason
    problem = preferAsyncioReactor()
    if problem is not None:
        log.warn(
            "{problem}; until then offers are answered with WEBRTC_UNAVAILABLE", problem=problem
        )
        return problem
    log.info("WebRTC enabled (aiortc on the asyncio reactor)")
    return None
