"""
Test doubles for rpmiddleware, for our tests and for plugin authors':

  - L{rpmiddleware.testing.kit}: L{PluginHarness}, a plugin in a real chain
    with a Clock, L{pluginServices} to build it with, L{builtinPlugin} to
    test it beside built-in ones, L{exampleCard} and the other examples;
    a plugin author's tests import these from here
    (C{from rpmiddleware.testing import PluginHarness});
  - L{rpmiddleware.testing.simulator}: an RPEngine simulator, in memory or
    over a real loopback socket;
  - L{rpmiddleware.testing.live}: a middleware on a free loopback port and
    WebSocket test peers.
"""

from rpmiddleware.testing.kit import (
    REFERENCE_CARD,
    EngineWouldRefuse,
    FakeSession,
    HeldHasher,
    PluginHarness,
    builtinPlugin,
    captureLogEvents,
    exampleCard,
    examplePromptContext,
    exampleResponseRule,
    pluginServices,
)

__all__ = [
    "REFERENCE_CARD",
    "EngineWouldRefuse",
    "FakeSession",
    "HeldHasher",
    "PluginHarness",
    "builtinPlugin",
    "captureLogEvents",
    "exampleCard",
    "examplePromptContext",
    "exampleResponseRule",
    "pluginServices",
]
