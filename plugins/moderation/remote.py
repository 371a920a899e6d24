"""
The moderation plugin's remote mode: an OpenAI-compatible C{/v1/moderations}
endpoint that classifies whole texts.

It is asked about the player's message and transcript and the completed
reply, never about deltas: a round trip per delta would stall every reply by
the service's latency, and a classifier judges a sentence, not a word piece.
Connections are kept open between checks, and a check never fails: a service
that does not answer in time, or answers nonsense, is judged by
C{fail_policy}.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, TimeoutError, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.builtin.moderation.settings import ModerationSettings

if TYPE_CHECKING:
    from treq.client import HTTPClient
    from twisted.web.client import HTTPConnectionPool

#: C{None}: the text may pass; else why it may not.
Verdict = str | None


def _timedOut(result: Any, timeout: float) -> Failure:
    """
    Whatever the cancelled request failed with (treq wraps the cancellation
    in ResponseNeverReceived), the cause was the timeout.
    """
    return Failure(TimeoutError(f"no answer within {timeout:g} s"))


class _Treq:
    """treq's API (C{post}, C{content}) over one L{HTTPClient}."""

    def __init__(self, client: HTTPClient) -> None:
        import treq

        self.post = client.post
        self.content = treq.content


class ModerationService:
    """
    The remote service of one moderation plugin.
    """

    log = Logger()

    def __init__(self, settings: ModerationSettings, reactor: Any, http: Any = None) -> None:
        """
        @param http: what makes the HTTP requests, treq's API (C{post},
            C{content}); by default treq over persistent connections on
            C{reactor}.  Tests give C{treq.testing.StubTreq} of a stand-in
            resource, so no socket is opened.
        """
        if reactor is None:
            raise ValueError("remote_url needs a reactor")
        self.settings = settings
        self.reactor = reactor
        self._pool: HTTPConnectionPool | None = None
        if http is None:
            # treq and Twisted's HTTP client are imported only here: a
            # moderation plugin without remote_url (or none) never needs them.
            from treq.client import HTTPClient
            from twisted.web.client import Agent, HTTPConnectionPool

            # Persistent connections: a check should not pay a TCP handshake.
            self._pool = HTTPConnectionPool(reactor, persistent=True)
            http = _Treq(HTTPClient(Agent(reactor, pool=self._pool)))
        self._http = http

    def close(self) -> Deferred[Any]:
        """
        Close the connections kept open to the service.
        """
        if self._pool is None:
            return succeed(None)
        return self._pool.closeCachedConnections()

    def check(self, text: str) -> Deferred[Verdict]:
        """
        Fires with C{None} when C{text} may pass, else with the reason it
        may not; never fails.
        """
        s = self.settings
        body = {"input": text, "model": s.remote_model}
        d: Deferred[Any] = self._http.post(s.remote_url, json=body)
        d.addCallback(self._readVerdict)
        d.addTimeout(s.remote_timeout, self.reactor, onTimeoutCancel=_timedOut)
        return d.addErrback(self._failed)

    def _readVerdict(self, response: Any) -> Deferred[Verdict]:
        def parse(content: bytes) -> Verdict:
            if response.code != 200:
                raise ValueError(f"HTTP {response.code}")
            try:
                flagged = json.loads(content)["results"][0]["flagged"]
            except (ValueError, LookupError, TypeError):
                raise ValueError("an answer without results[0].flagged")
            if not isinstance(flagged, bool):
                raise ValueError("results[0].flagged is not a boolean")
            return "it was flagged by the moderation service" if flagged else None

        content: Deferred[bytes] = self._http.content(response)
        return content.addCallback(parse)

    def _failed(self, failure: Failure) -> Verdict:
        if failure.check(TimeoutError):
            why = f"no answer within {self.settings.remote_timeout:g} s"
        else:
            why = str(failure.value) or type(failure.value).__name__
        closed = self.settings.fail_policy == "closed"
        self.log.warn(
            "the moderation service failed ({why}); fail_policy is {policy}, so the text {result}",
            why=why,
            policy=self.settings.fail_policy,
            result="is treated as flagged" if closed else "passes",
        )
        if closed:
            return f"the moderation service could not check it ({why}) and fail_policy is closed"
        return None
