"""
Tools for playbooks: how a plugin provides one, how they are found, and how
calls run with their timeouts (L{ToolRunner}).

A tool is a game action a transition runs on its way (give a quest, open a
door, look up an inventory).  Two kinds:

  - B{middleware} tools are Python: an L{ITool} from an L{IToolProvider}
    announced in a C{twisted/plugins/} drop-in (like plugin factories) or
    handed to the playbook plugin in code.  Their result comes back as a
    Deferred, so a tool may talk to the network or a thread;
  - B{client} tools are run by the game: the client receives
    C{tool-call-start} and answers with a C{tool-result} message.

Both end the same way, in C{tool-call-end}, and a failure or a timeout is a
TOOL_ERROR for that call only: the conversation goes on.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, TimeoutError, maybeDeferred
from twisted.logger import Logger
from twisted.plugin import IPlugin, getPlugins
from twisted.python.failure import Failure
from zope.interface import implementer

from rpmiddleware.builtin.playbook import wire
from rpmiddleware.builtin.playbook.model import Playbook, ToolUse
from rpmiddleware.builtin.playbook.state import SessionState, ToolRun
from rpmiddleware.plugin import Envelope, ITool, IToolProvider, unclaimedResult

log = Logger()


@dataclass(frozen=True)
class ToolCall:
    """
    What a tool is told about the call it serves.
    """

    callId: str
    name: str
    clientId: str
    characterId: str | None
    playbook: str
    stage: str
    #: The turn whose transition ran the tool, if a turn did.
    requestId: str | None
    reactor: Any


@implementer(ITool)
class FunctionTool:
    """
    An L{ITool} from a function C{(arguments, call) -> result or Deferred}.
    """

    def __init__(
        self,
        name: str,
        function: Callable[[dict[str, Any], ToolCall], Any],
        description: str = "",
        timeout: float | None = None,
    ) -> None:
        self.name = name
        self.function = function
        self.description = description
        self.timeout = timeout

    def call(self, arguments: dict[str, Any], call: ToolCall) -> Any:
        return self.function(arguments, call)

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name}>"


@implementer(IPlugin, IToolProvider)
class ToolSet:
    """
    Some tools, as an L{IToolProvider} that a C{twisted/plugins/} drop-in can
    announce (it provides L{IPlugin} for L{getPlugins}).
    """

    def __init__(self, *tools: Any) -> None:
        self._tools = list(tools)

    def tools(self) -> list[Any]:
        return list(self._tools)


def discoverTools(
    providers: Sequence[Any] = (), package: ModuleType | None = None, dropins: bool = True
) -> dict[str, Any]:
    """
    Every tool by name: those of C{providers} first, then those announced in
    drop-ins of C{package} (C{twisted.plugins} unless given).  A name given
    twice keeps the first and logs the second.
    """
    found: dict[str, Any] = {}
    sources: list[Any] = list(providers)
    if dropins:
        if package is None:
            import twisted.plugins

            package = twisted.plugins
        sources.extend(getPlugins(IToolProvider, package))
    for provider in sources:
        try:
            tools: Iterable[Any] = provider.tools()
            for tool in tools:
                if not ITool.providedBy(tool):
                    log.error(
                        "{provider} offered {tool!r}, not an ITool", provider=provider, tool=tool
                    )
                elif tool.name in found:
                    log.warn(
                        "two tools are named {name}; {provider} loses",
                        name=tool.name,
                        provider=provider,
                    )
                else:
                    found[tool.name] = tool
        except Exception:
            log.failure(
                "tool provider {provider} failed; its tools are left out", provider=provider
            )
    return found


class ToolFailed(Exception):
    """
    A tool ended with an error it described (a client's C{tool-result}
    C{error}, or a result that is not JSON).
    """


def invoke(tool: Any, arguments: dict[str, Any], call: ToolCall) -> Deferred[Any]:
    """
    Call a middleware tool; whatever it does (returns, raises, returns a
    Deferred) comes back as a Deferred.
    """
    return maybeDeferred(tool.call, arguments, call)


def withTimeout(d: Deferred[Any], seconds: float, reactor: Any) -> Deferred[Any]:
    """
    C{d}, failing with L{TimeoutError} after C{seconds} (and cancelled, so a
    tool that supports cancellation stops its work).
    """
    return d.addTimeout(seconds, reactor)


def checkedResult(result: Any) -> Any:
    """
    C{result} if it can go to a client as JSON; else L{ToolFailed}.
    """
    try:
        json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ToolFailed(f"its result is not JSON ({e})")
    return result


def describeFailure(failure: Failure, name: str, runBy: str, timeout: float) -> str:
    """
    The sentence a TOOL_ERROR says for a failed call.
    """
    if failure.check(TimeoutError, CancelledError):
        if runBy == "client":
            return (
                f"tool {name}: the client sent no tool-result within {timeout:g} s; "
                "the call was abandoned"
            )
        return f"tool {name} did not finish within {timeout:g} s; the call was abandoned"
    if failure.check(ToolFailed):
        return f"tool {name} failed: {failure.value}"
    kind = failure.type.__name__ if failure.type is not None else "Exception"
    return f"tool {name} failed: {kind}: {failure.value}"


class ToolRunner:
    """
    Runs the tools of transitions: those of one transition one after the
    other, each with its timeout, telling the client each call's start and
    end (C{tool-call-start}, C{tool-call-end}, and C{TOOL_ERROR} when it
    failed).  A call never fails the transition: its ending is reported and
    the next tool runs.

    @param tools: the middleware's tools (L{ITool}) by name.
    @param clock: gives the L{IReactorTime} that times the calls.
    @param post: sends an envelope toward the game (in order, later).
    @param noted: told when a call's timeline entry changed.
    @param ended: told C{(state, run, outcome, value)} when a call ended,
        C{outcome} being C{"success"} (C{value} its result) or C{"error"}.
    """

    log = log

    def __init__(
        self,
        tools: Mapping[str, Any],
        defaultTimeout: float,
        clock: Callable[[], Any],
        post: Callable[[Envelope], None],
        noted: Callable[[ToolRun], None],
        ended: Callable[[SessionState, ToolRun, str, Any], None],
    ) -> None:
        self.tools = tools
        self.defaultTimeout = defaultTimeout
        self._clock = clock
        self._post = post
        self._noted = noted
        self._ended = ended

    def runAll(
        self,
        state: SessionState,
        playbook: Playbook,
        uses: Sequence[ToolUse],
        requestId: str | None,
    ) -> None:
        d: Deferred[Any] = Deferred()
        for use in uses:
            d.addCallback(self._next, state, playbook, use, requestId)
        d.callback(None)

    def _next(
        self,
        ignored: object,
        state: SessionState,
        playbook: Playbook,
        use: ToolUse,
        requestId: str | None,
    ) -> Deferred[None]:
        return self.run(state, playbook, use.name, use.arguments, requestId)

    def run(
        self,
        state: SessionState,
        playbook: Playbook,
        name: str,
        arguments: dict[str, Any],
        requestId: str | None,
    ) -> Deferred[None]:
        """
        One call; the Deferred fires (never fails) when it ended.
        """
        spec = playbook.tools[name]
        tool = self.tools.get(name) if spec.runBy == "middleware" else None
        ownTimeout = getattr(tool, "timeout", None) if tool is not None else None
        timeout = float(spec.timeout or ownTimeout or self.defaultTimeout)
        clock = self._clock()
        callId = uuid.uuid4().hex
        arguments = copy.deepcopy(arguments)
        run = ToolRun(callId, name, spec.runBy, arguments, clock.seconds(), requestId)
        run.entry = {"callId": callId, "name": name, "runBy": spec.runBy, "outcome": "running"}
        state.running[callId] = run
        if requestId is None:
            # Fired by silence, an event or another tool: it goes with the next turn.
            state.unattached.append(run)
        else:
            self._noted(run)
        self.log.info(
            "session {client}: tool {name} ({runBy}) starts, call {callId}",
            client=state.clientId,
            name=name,
            runBy=spec.runBy,
            callId=callId,
        )
        self._post(
            wire.toGame(
                wire.TOOL_CALL_START,
                state.clientId,
                name=name,
                callId=callId,
                arguments=arguments,
                runBy=spec.runBy,
                **_turnOf(requestId),
            )
        )
        if tool is None:
            d: Deferred[Any] = Deferred()
            state.clientCalls[callId] = d
        else:
            call = ToolCall(
                callId,
                name,
                state.clientId,
                state.characterId,
                playbook.name,
                state.stage or "",
                requestId,
                clock,
            )
            d = invoke(tool, copy.deepcopy(arguments), call)
        withTimeout(d, timeout, clock)
        d.addCallback(checkedResult)
        return d.addBoth(self._finished, state, run, timeout)

    def answer(
        self, state: SessionState | None, clientId: str, callId: Any, result: Any, error: Any
    ) -> bool:
        """
        A client's C{tool-result}.

        @return: whether a call of that session was waiting for it (if not,
            the client is told C{INVALID_MESSAGE}).
        """
        waiting = state.clientCalls.pop(callId, None) if state is not None else None
        if waiting is None:
            self._post(
                wire.toGame(
                    wire.ERROR,
                    clientId,
                    code="INVALID_MESSAGE",
                    message=unclaimedResult(callId),
                )
            )
            return False
        if error is not None:
            waiting.errback(ToolFailed(str(error)))
        else:
            waiting.callback(result)
        return True

    def _finished(self, result: Any, state: SessionState, run: ToolRun, timeout: float) -> None:
        state.running.pop(run.callId, None)
        state.clientCalls.pop(run.callId, None)
        durationMs = max(0, round((self._clock().seconds() - run.started) * 1000))
        end: dict[str, Any] = {"callId": run.callId}
        if isinstance(result, Failure):
            error = describeFailure(result, run.name, run.runBy, timeout)
            outcome, value = "error", None
            end["error"] = error
            if run.runBy == "middleware" and not result.check(
                ToolFailed, TimeoutError, CancelledError
            ):
                # A tool that raised: its traceback is for the plugin's author.
                self.log.failure("tool {name} raised", result, name=run.name)
            self.log.info(
                "session {client}: {error}", client=state.clientId, error=error, callId=run.callId
            )
        else:
            outcome, value = "success", result
            end["result"] = result
        end["durationMs"] = durationMs
        end.update(_turnOf(run.requestId))
        self._post(wire.toGame(wire.TOOL_CALL_END, state.clientId, **end))
        run.entry.update(outcome=outcome, durationMs=durationMs)
        if outcome == "error":
            run.entry["error"] = error
            self._post(
                wire.toGame(
                    wire.ERROR, state.clientId, code="TOOL_ERROR", message=error, callId=run.callId
                )
            )
        state.recentTools.append(dict(run.entry))
        if run.requestId is not None:
            self._noted(run)
        self._ended(state, run, outcome, value)


def _turnOf(requestId: str | None) -> dict[str, str]:
    """The C{turnId} of a call a turn's transition made (none for a game event's)."""
    return {"turnId": requestId} if requestId else {}
