"""
The plugin chain: calls each plugin in turn and keeps a failing one from
hurting anything else.

Game-to-engine envelopes pass the plugins in configured order; engine-to-game
envelopes pass them in reverse, so the plugin nearest the engine sees a reply
first.  While every plugin answers synchronously an envelope crosses the whole
chain in one reactor turn with no Deferred allocated.

A plugin that fails (raises, or its Deferred fails) is logged and skipped:
the envelope goes on unchanged.  One that says C{failClosed = True} stops
the envelope instead (L{PluginChain._failClosed}): it goes no further, and
the request it belongs to ends at once with a C{request.error}
C{request_failed} naming the plugin, sent toward the game from that
plugin's place; a request RPEngine is already working on is also cancelled
there (C{request.cancel} toward RPEngine).  A withdrawal
(C{request.cancel}, ...) is never stopped: it only ends work.

A plugin's life (L{rpmiddleware.plugin.interfaces.IPluginLifecycle}): the
chain gives each plugin its context once, when it is built (C{attached}),
in order, before any envelope; L{PluginChain.close} tells every plugin the
daemon is stopping and waits for them a bounded time.  Every optional hook
(C{attached}, C{close}, the client-session hooks) reaches each plugin that
has it, declared or not, and one that fails is logged by name and skipped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, gatherResults, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from rpmiddleware.plugin.interfaces import (
    IChainContext,
    IChainObserver,
    IEngineSessionInfo,
    IEnvelopePlugin,
)
from rpmiddleware.protocol.envelope import Direction, Envelope, summarize
from rpmiddleware.protocol.messages import MESSAGES, WITHDRAWING

Deliver = Callable[[Envelope], Any]

#: How many requests ended by a fail-closed plugin are remembered.
_ENDED_CLOSED_KEPT = 1024

#: Seconds (of the reactor's clock) the chain waits for its plugins to close,
#: all together, before it abandons those still closing.
CLOSE_TIMEOUT = 5.0

_METHOD = {
    Direction.TO_ENGINE: "envelopeToEngine",
    Direction.TO_GAME: "envelopeToGame",
}


@implementer(IChainContext)
class _PluginContext:
    """
    One plugin's handle on the chain, positioned at that plugin.
    """

    def __init__(self, chain: PluginChain, index: int, plugin: IEnvelopePlugin) -> None:
        self._chain = chain
        self._index = index
        self.plugin = plugin

    @property
    def reactor(self) -> Any:
        return self._chain.reactor

    @property
    def session(self) -> IEngineSessionInfo | None:
        return self._chain.session

    def sendToEngine(self, envelope: Envelope) -> Deferred[None]:
        envelope.meta.setdefault("origin", self.plugin.name)
        return self._chain._run(envelope, Direction.TO_ENGINE, self._index + 1)

    def sendToGame(self, envelope: Envelope) -> Deferred[None]:
        envelope.meta.setdefault("origin", self.plugin.name)
        return self._chain._run(envelope, Direction.TO_GAME, len(self._chain.plugins) - self._index)


class PluginChain:
    """
    An ordered chain of L{IEnvelopePlugin}s between two ends.

    @param toEngine: called with each envelope that leaves the chain toward
        RPEngine.
    @param toGame: called with each envelope that leaves toward the game.
    """

    log = Logger()

    def __init__(
        self,
        plugins: Sequence[IEnvelopePlugin],
        toEngine: Deliver,
        toGame: Deliver,
        reactor: Any,
    ) -> None:
        self.plugins = list(plugins)
        self.reactor = reactor
        self.session: IEngineSessionInfo | None = None
        self._ends = {Direction.TO_ENGINE: toEngine, Direction.TO_GAME: toGame}
        contexts = [_PluginContext(self, i, p) for i, p in enumerate(self.plugins)]
        self._contexts = contexts
        forward = [(p, p.envelopeToEngine, c) for p, c in zip(self.plugins, contexts, strict=True)]
        backward = [
            (p, p.envelopeToGame, c)
            for p, c in zip(reversed(self.plugins), reversed(contexts), strict=True)
        ]
        self._steps = {Direction.TO_ENGINE: forward, Direction.TO_GAME: backward}
        self._observers = [p for p in self.plugins if IChainObserver.providedBy(p)]
        #: Requests a fail-closed plugin ended (the newest few), so that
        #: their later envelopes do not end them again.
        self._endedClosed: OrderedDict[str, None] = OrderedDict()
        self._closed = False
        for plugin, context in zip(self.plugins, contexts, strict=True):
            self._callOptional(plugin, "attached", context)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    def addObserver(self, observer: Any) -> None:
        """
        Tell C{observer} (an L{IChainObserver} with a C{name}, not in the
        chain: metrics) about every envelope that leaves the chain.
        """
        self._observers.append(observer)

    def removeObserver(self, observer: Any) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    def sendToEngine(self, envelope: Envelope) -> Deferred[None]:
        """
        An envelope from the game enters the chain.
        """
        return self._run(envelope, Direction.TO_ENGINE, 0)

    def sendToGame(self, envelope: Envelope) -> Deferred[None]:
        """
        An envelope from RPEngine enters the chain.
        """
        return self._run(envelope, Direction.TO_GAME, 0)

    def engineSessionStarted(self, session: IEngineSessionInfo) -> None:
        self.session = session
        for plugin, context in zip(self.plugins, self._contexts, strict=True):
            self._callHook(plugin, "engineSessionStarted", session, context)

    def engineSessionEnded(self, session: IEngineSessionInfo) -> None:
        if self.session is session:
            self.session = None
        for plugin, context in zip(self.plugins, self._contexts, strict=True):
            self._callHook(plugin, "engineSessionEnded", session, context)

    def clientSessionEnded(self, clientId: str) -> None:
        """
        Tell every plugin that has the hook (those with client messages of
        their own, L{IClientExtension}, and any other) that a client session
        is over.
        """
        for plugin, context in zip(self.plugins, self._contexts, strict=True):
            self._callOptional(plugin, "clientSessionEnded", clientId, context)

    def clientSessionResumed(self, clientId: str) -> None:
        """
        Tell every plugin that has the hook that a client took its session
        back (C{reconnect}).
        """
        for plugin, context in zip(self.plugins, self._contexts, strict=True):
            self._callOptional(plugin, "clientSessionResumed", clientId, context)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> Deferred[None]:
        """
        The daemon is stopping: call every plugin's C{close} (those that have
        one), in chain order, each isolated: one that raises or fails is
        logged by name and the others close all the same.  Wait for the
        Deferreds they return together, at most C{timeout} seconds of the
        reactor's clock; those still closing then are logged by name and
        abandoned.  A second call closes nothing again.

        @return: a Deferred that fires with C{None} when every plugin closed
            or was abandoned; it never fails.
        """
        if self._closed:
            return succeed(None)
        self._closed = True
        #: The plugins still closing, by their place in the chain.
        closing: dict[int, str] = {}
        waiting: list[tuple[int, str, Deferred[object]]] = []
        for index, plugin in enumerate(self.plugins):
            close = getattr(plugin, "close", None)
            if not callable(close):
                continue
            d: Deferred[object] = maybeDeferred(close)
            d.addErrback(self._closeFailed, plugin.name)
            if not d.called:
                closing[index] = plugin.name
                waiting.append((index, plugin.name, d))
        if not closing:
            return succeed(None)
        done: Deferred[None] = Deferred()

        def abandon() -> None:
            names = ", ".join(closing.values())
            self.log.error(
                "plugin(s) {plugins} did not close within {timeout} s: abandoned, the "
                "daemon stops without waiting for them",
                plugins=names,
                timeout=timeout,
            )
            done.callback(None)

        timer = self.reactor.callLater(timeout, abandon)

        def closed(result: object, index: int) -> None:
            del closing[index]
            if not closing and not done.called:
                timer.cancel()
                done.callback(None)

        for index, _, d in waiting:
            d.addCallback(closed, index)
        return done

    def _closeFailed(self, failure: Failure, name: str) -> None:
        self.log.failure(
            "plugin {plugin} failed to close; the others close all the same",
            failure,
            plugin=name,
        )

    def _callOptional(self, plugin: IEnvelopePlugin, name: str, *args: Any) -> None:
        """
        Call the plugin's hook C{name} when it has one.
        """
        if callable(getattr(plugin, name, None)):
            self._callHook(plugin, name, *args)

    def _callHook(self, plugin: IEnvelopePlugin, name: str, *args: Any) -> None:
        try:
            getattr(plugin, name)(*args)
        except Exception:
            self.log.failure(
                "plugin {plugin} failed in {hook}; the chain goes on",
                plugin=plugin.name,
                hook=name,
            )

    def _run(self, envelope: Envelope, direction: Direction, start: int) -> Deferred[None]:
        meta = envelope.meta
        if "enteredAt" not in meta:
            meta["enteredAt"] = self.reactor.seconds()
        steps = self._steps[direction]
        for index in range(start, len(steps)):
            plugin, method, context = steps[index]
            try:
                result = method(envelope, context)
            except Exception:
                failure = Failure()
                if getattr(plugin, "failClosed", False) is True:
                    return self._failClosed(failure, envelope, direction, index)
                self._isolate(failure, plugin, envelope, direction)
                continue
            if result is envelope:
                continue
            if result is None:
                self._decided(envelope, plugin, "dropped")
                self._left(envelope, direction, "dropped")
                return succeed(None)
            if isinstance(result, Deferred):
                self._decided(envelope, plugin, "held")
                return self._resume(result, envelope, direction, index, plugin)
            envelope = self._checked(result, envelope, plugin, direction)
        self._deliver(envelope, direction)
        return succeed(None)

    def _resume(
        self,
        held: Deferred[Any],
        original: Envelope,
        direction: Direction,
        index: int,
        plugin: IEnvelopePlugin,
    ) -> Deferred[None]:
        def released(result: Any) -> Deferred[None] | None:
            if result is None:
                self._decided(original, plugin, "dropped")
                self._left(original, direction, "dropped")
                return None
            envelope = self._checked(result, original, plugin, direction)
            return self._run(envelope, direction, index + 1)

        def failed(failure: Failure) -> Deferred[None]:
            if getattr(plugin, "failClosed", False) is True:
                return self._failClosed(failure, original, direction, index)
            self._isolate(failure, plugin, original, direction)
            return self._run(original, direction, index + 1)

        return held.addCallbacks(released, failed)

    def _checked(
        self, result: Any, original: Envelope, plugin: IEnvelopePlugin, direction: Direction
    ) -> Envelope:
        if isinstance(result, Envelope):
            if result is not original:
                result.meta = {**original.meta, **result.meta}
                self._decided(result, plugin, "replaced")
            return result
        self.log.error(
            "plugin {plugin} returned {kind} for {envelope}, not an Envelope or None; "
            "passing the envelope on unchanged",
            plugin=plugin.name,
            kind=type(result).__name__,
            envelope=summarize(original.fields),
            direction=direction.value,
        )
        return original

    def _decided(self, envelope: Envelope, plugin: IEnvelopePlugin, decision: str) -> None:
        envelope.meta.setdefault("decisions", []).append((plugin.name, decision))

    def _isolate(
        self, failure: Failure, plugin: IEnvelopePlugin, envelope: Envelope, direction: Direction
    ) -> None:
        self._decided(envelope, plugin, "failed")
        self.log.failure(
            "plugin {plugin} failed on {envelope} ({direction}); passing it on unchanged",
            failure,
            plugin=plugin.name,
            envelope=summarize(envelope.fields),
            direction=direction.value,
        )

    def _failClosed(
        self, failure: Failure, envelope: Envelope, direction: Direction, index: int
    ) -> Deferred[None]:
        """
        The fail-closed plugin at step C{index} failed on C{envelope}: it goes
        no further, and its request ends with a C{request.error} toward the
        game from the plugin's place (the plugins between it and the game
        hear the ending; the client's turn says C{error}).  A request
        RPEngine already has is cancelled toward RPEngine from there too.
        """
        plugin, _, context = self._steps[direction][index]
        if envelope.type in WITHDRAWING:
            # Stopping a withdrawal would keep its request running.
            self._isolate(failure, plugin, envelope, direction)
            return self._run(envelope, direction, index + 1)
        self._decided(envelope, plugin, "failed-closed")
        requestId = envelope.requestId
        self.log.failure(
            "plugin {plugin} failed on {envelope} ({direction}) and fails closed: the "
            "envelope goes no further and request {requestId} ends",
            failure,
            plugin=plugin.name,
            envelope=summarize(envelope.fields),
            direction=direction.value,
            requestId=requestId,
        )
        self._left(envelope, direction, "dropped")
        if not requestId or requestId in self._endedClosed:
            return succeed(None)
        self._endedClosed[requestId] = None
        while len(self._endedClosed) > _ENDED_CLOSED_KEPT:
            self._endedClosed.popitem(last=False)
        spec = MESSAGES.get(envelope.type)
        if direction is Direction.TO_GAME:
            live = spec is None or not spec.terminal
        else:
            live = spec is None or not spec.opensRequest
        sessionId = self.session.sessionId if self.session is not None else None
        error = Envelope.build(
            "request.error",
            sessionId,
            requestId=requestId,
            code="request_failed",
            message=(
                f"plugin {plugin.name} failed on this request's {envelope.type} and fails "
                "closed, so the request ended here"
            ),
            retryable=False,
        )
        error.meta.update(synthetic=True, origin=plugin.name)
        ends = [context.sendToGame(error)]
        if live:
            cancel = Envelope.build("request.cancel", sessionId, requestId=requestId)
            cancel.meta["origin"] = plugin.name
            ends.append(context.sendToEngine(cancel))
        return gatherResults(ends).addCallback(lambda _: None)

    def _left(self, envelope: Envelope, direction: Direction, outcome: str) -> None:
        for observer in self._observers:
            try:
                observer.envelopeLeft(envelope, direction, outcome)
            except Exception:
                self.log.failure("observer {plugin} failed", plugin=observer.name)

    def _deliver(self, envelope: Envelope, direction: Direction) -> None:
        self._left(envelope, direction, "delivered")
        try:
            self._ends[direction](envelope)
        except Exception:
            self.log.failure(
                "delivering {envelope} ({direction}) failed",
                envelope=summarize(envelope.fields),
                direction=direction.value,
            )
