"""
Tools for playbooks: how a plugin provides one, how they are found, and how
one call runs with its timeout.

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

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, TimeoutError, maybeDeferred
from twisted.logger import Logger
from twisted.plugin import IPlugin, getPlugins
from twisted.python.failure import Failure
from zope.interface import implementer

from rpmiddleware.interfaces import ITool, IToolProvider

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
