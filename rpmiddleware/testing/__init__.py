"""
Test doubles for rpmiddleware, for our tests and for plugin authors':

  - L{rpmiddleware.testing.kit}: L{PluginHarness}, a plugin in a real chain
    with a Clock, L{pluginServices} to build it with, and L{exampleCard};
  - L{rpmiddleware.testing.simulator}: an RPEngine simulator, in memory or
    over a real loopback socket;
  - L{rpmiddleware.testing.live}: a middleware on a free loopback port and
    WebSocket test peers.
"""

from rpmiddleware.testing.kit import FakeSession, PluginHarness, exampleCard, pluginServices

__all__ = ["FakeSession", "PluginHarness", "exampleCard", "pluginServices"]
