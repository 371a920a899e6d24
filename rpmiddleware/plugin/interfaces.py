"""
The contracts between the middleware and its plugins.

A plugin is a provider of L{IEnvelopePlugin}: one narrow job, applied to every
envelope that passes.  Envelopes travel game-to-engine through the plugins in
configured order and engine-to-game in the reverse order, like Scrapy's
downloader middleware; the L{chain <rpmiddleware.core.chain.PluginChain>} owns the
calling, the Deferreds and the error isolation so that plugins stay small.

Third-party plugins announce themselves with a drop-in module in a
C{twisted/plugins/} folder holding an object that provides L{IPluginFactory}.
"""

from __future__ import annotations

from zope.interface import Attribute, Interface


class IEngineSessionInfo(Interface):
    """
    What a plugin may know of one RPEngine connection session.
    """

    sessionId = Attribute("The sessionId sent in welcome (str).")
    startedAt = Attribute("Reactor time at which welcome was sent (float).")


class IChainContext(Interface):
    """
    A plugin's view of the chain at its own position.

    Envelopes a plugin originates start at the plugin's position and travel on
    in their direction, so they pass every plugin after it and never the ones
    before: a plugin that answers a request is not asked about its own answer.
    """

    plugin = Attribute("The IEnvelopePlugin this context belongs to.")
    reactor = Attribute("The reactor (IReactorTime at least) the middleware runs on.")
    session = Attribute(
        "The live RPEngine session (IEngineSessionInfo), or None while no RPEngine is connected."
    )

    def sendToEngine(envelope):  # type: ignore[no-untyped-def]
        """
        Originate C{envelope} toward RPEngine from just after this plugin.

        @return: a Deferred that fires when the envelope has left the chain
            (sent, queued, or dropped by a later plugin).
        """

    def sendToGame(envelope):  # type: ignore[no-untyped-def]
        """
        Originate C{envelope} toward the game from just after this plugin (in
        the engine-to-game order).

        @return: a Deferred, as for L{sendToEngine}.
        """


class IEnvelopePlugin(Interface):
    """
    One link of the chain.

    Both envelope methods return the envelope to pass on (the same one, a
    changed one or a new one), C{None} to drop it, or a Deferred that fires
    with either of those to hold it for a while.  A plugin that raises (or
    whose Deferred fails) is logged with its name and skipped: the envelope
    goes on unchanged and the connection lives.  A plugin whose class says
    C{failClosed = True} (L{rpmiddleware.plugin.base.ChainPlugin}) fails closed
    instead: the envelope goes no further, and the request it belongs to
    ends with a C{request.error} naming the plugin (L{rpmiddleware.core.chain}).

    Nothing orders held envelopes: one that a plugin holds lets later ones
    pass.  A plugin that needs order holds those too.
    """

    name = Attribute("The name configuration refers to this plugin by (str).")

    def envelopeToEngine(envelope, context):  # type: ignore[no-untyped-def]
        """
        See an envelope on its way from the game to RPEngine.

        @type envelope: L{rpmiddleware.protocol.envelope.Envelope}
        @type context: L{IChainContext}
        """

    def envelopeToGame(envelope, context):  # type: ignore[no-untyped-def]
        """
        See an envelope on its way from RPEngine to the game.
        """

    def engineSessionStarted(session, context):  # type: ignore[no-untyped-def]
        """
        A new RPEngine session began (C{welcome} was sent): per-session state
        starts empty.

        @type session: L{IEngineSessionInfo}
        """

    def engineSessionEnded(session, context):  # type: ignore[no-untyped-def]
        """
        That RPEngine session is over (the connection closed or was replaced).
        """


class IPluginLifecycle(Interface):
    """
    Optional: a plugin's life around its envelopes.  The chain calls each
    method a plugin has, whether or not it declares this interface
    (L{rpmiddleware.plugin.base.ChainPlugin} has both).

    A plugin is built (its factory), then attached to the chain, then sees
    envelopes and hooks, then is closed when the daemon stops.
    """

    def attached(context):  # type: ignore[no-untyped-def]
        """
        The chain was built: C{context} (an L{IChainContext}) is this
        plugin's place in it for the whole of its life, the same object
        every envelope method and hook is given.  Called once, for every
        plugin in chain order, before any envelope or hook; what a timer or
        a Python API call of the plugin sends goes through it.
        L{ChainPlugin <rpmiddleware.plugin.base.ChainPlugin>} keeps it as
        C{self.context}.
        """

    def close():  # type: ignore[no-untyped-def]
        """
        The daemon is stopping: write out and let go of what the plugin holds
        (a database, a file, connections, timers).  Envelopes may still pass
        while it closes; what it can no longer do it refuses.

        @return: C{None} when closed, or a Deferred that fires when closed.
            The core closes every plugin at once and waits for them together
            at most L{CLOSE_TIMEOUT <rpmiddleware.core.chain.CLOSE_TIMEOUT>}
            seconds (5) of the reactor's clock; one still closing then is
            logged by name and abandoned.  One that raises or fails is
            logged by name; the others close all the same.
        """


class IPluginFactory(Interface):
    """
    Makes a plugin from its configuration; what a drop-in announces.

    A provider must also provide L{twisted.plugin.IPlugin}, or
    L{twisted.plugin.getPlugins} will not see it;
    L{rpmiddleware.plugin.base.PluginFactory} does both.
    """

    name = Attribute("The unique name configuration refers to (str).")
    description = Attribute("One line on what the plugin does (str).")

    def buildPlugin(settings, services):  # type: ignore[no-untyped-def]
        """
        Make the plugin.

        @param settings: this plugin's table from the configuration file (a
            mapping, empty when the file has none).
            L{rpmiddleware.plugin.base.PluginFactory} given a settings
            class reads the table into it first and gives the build
            function that typed, checked value instead.
        @type services: L{IPluginServices} (the core gives a
            L{rpmiddleware.plugin.services.PluginServices})
        @return: an L{IEnvelopePlugin} provider.
        @raise ValueError: when C{settings} are wrong; the message is shown
            to the user at start-up.
        """


class IPluginServices(Interface):
    """
    What the middleware lends a plugin when it is built.
    """

    reactor = Attribute("The reactor the middleware runs on.")
    cards = Attribute("The shared rpmiddleware.cards.validation.CardHasher.")
    timeline = Attribute("The shared rpmiddleware.protocol.timeline.Timeline of requests.")
    config = Attribute(
        "The whole rpmiddleware.config.settings.Settings the daemon runs with: the "
        "core's own object, shared, not a copy, so a plugin reads it and never changes "
        "it (nothing tells the parts that read it of a change)."
    )


class IReplyStream(Interface):
    """
    One reply turn asked through the Python API.
    """

    requestId = Attribute("The requestId sent to RPEngine (str).")
    envelopes = Attribute("Every envelope received for this request so far, in order (list).")
    done = Attribute(
        "Deferred firing with the terminal reply.completed envelope, or failing with "
        "rpmiddleware.core.replystream.ReplyFailed (request.error) or ReplyCancelled "
        "(reply.cancelled)."
    )

    def subscribe(observer):  # type: ignore[no-untyped-def]
        """
        Call C{observer(envelope)} for each envelope of this request, starting
        with those already received.
        """

    def cancel(meta=None):  # type: ignore[no-untyped-def]
        """
        Ask RPEngine to stop this reply; C{done} then fails with ReplyCancelled.
        C{meta}, if given, goes on the cancel's envelope (as
        C{meta.PLAYED}: how much of the reply's speech the player was played).
        """


class IChainObserver(Interface):
    """
    Optional, for plugins that watch rather than act (logging, metrics): told
    once about every envelope when it leaves the chain, with what each plugin
    decided in C{envelope.meta["decisions"]}.
    """

    def envelopeLeft(envelope, direction, outcome):  # type: ignore[no-untyped-def]
        """
        @param direction: L{rpmiddleware.protocol.envelope.Direction} it travelled.
        @param outcome: C{"delivered"} (it reached its end) or C{"dropped"}
            (a plugin dropped it).
        """


class ITool(Interface):
    """
    One game action a playbook may run on a transition (the playbook plugin,
    C{docs/playbooks.md}).  Tools run on the reactor thread: one that blocks
    or computes for long returns a Deferred from a thread instead.
    """

    name = Attribute("The name playbooks call it by (str).")
    description = Attribute("One line on what it does (str).")
    timeout = Attribute(
        "Seconds it may take before the call fails with TOOL_ERROR (float), or None for "
        "the playbook plugin's tool_timeout."
    )

    def call(arguments, call):  # type: ignore[no-untyped-def]
        """
        Run the tool.

        @param arguments: the JSON object the playbook gives (a fresh dict).
        @param call: who and where: C{callId}, C{name}, C{clientId},
            C{characterId}, C{playbook}, C{stage}, C{requestId}, C{reactor}
            (a L{rpmiddleware.builtin.playbook.tools.ToolCall}).
        @return: a JSON-serialisable result, or a Deferred firing with one.
            Raising, failing, or not answering within the timeout ends the
            call with TOOL_ERROR; the conversation goes on.
        """


class IToolProvider(Interface):
    """
    Provides tools to playbooks.  Announce one in a C{twisted/plugins/}
    drop-in (it must also provide L{twisted.plugin.IPlugin};
    L{rpmiddleware.builtin.playbook.tools.ToolSet} does both), or pass it to the playbook
    plugin in code.
    """

    def tools():  # type: ignore[no-untyped-def]
        """
        @return: an iterable of L{ITool} providers.
        """


class IClientExtension(Interface):
    """
    Optional, for plugins that add client messages of their own (the memory
    plugin's C{memory}, a third party's): the client endpoint accepts the
    types named here while the plugin is in the chain, and hands each such
    message to the chain as an envelope (L{rpmiddleware.plugin.clientext}), which
    the plugin consumes.  What the plugin sends a client travels toward the
    game the same way; nothing in the core knows the plugin's messages.

    The two client-session hooks reach every plugin that has them, whether
    or not it declares this interface (a plugin that keeps something per
    client without messages of its own needs them too).
    """

    clientMessageTypes = Attribute(
        "The client message types this plugin takes (a tuple of str); none may be a "
        "type of the client protocol itself."
    )

    def clientSessionEnded(clientId, context):  # type: ignore[no-untyped-def]
        """
        Client session C{clientId} is over (expired past its TTL, or given
        up for another): what the plugin kept for it may go.
        """

    def clientSessionResumed(clientId, context):  # type: ignore[no-untyped-def]
        """
        A client took session C{clientId} back with C{reconnect}: messages
        sent to the session while no connection had it were dropped, so the
        plugin may tell it again what it must know (the playbook: its stage).
        """


class IMetricsSource(Interface):
    """
    Optional, for plugins with figures of their own for C{/metrics}.
    """

    def collectMetrics():  # type: ignore[no-untyped-def]
        """
        @return: an iterable of C{prometheus_client.core.Metric} families,
            read on every scrape (names start with C{rpmiddleware_}).
        """


class IHeldWork(Interface):
    """
    Optional, for plugins that hold requests back for a while (the capacity
    gate): the console's queue chart and C{/metrics}
    (C{rpmiddleware_waiting_requests}, labelled with the plugin's name) count
    what every provider in the chain holds.
    """

    def held():  # type: ignore[no-untyped-def]
        """
        @return: the requestIds held now, in the order they would go on (a
            list of str).
        """


class ITimingSource(Interface):
    """
    Optional, for plugins that time work of their own (the audio-resample
    plugin's conversions): C{/metrics} adds an observer to
    C{timingObservers} and keeps a histogram of what it is told.
    """

    timingObservers = Attribute(
        "A list of callables the plugin calls with (direction: str, seconds: float) after "
        'each piece of work it times (direction "to_engine" or "to_game"); observers add '
        "and remove themselves."
    )
