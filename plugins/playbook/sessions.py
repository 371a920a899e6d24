"""
Every client session the playbook plugin remembers, and which playbook each
plays.

Sessions are bounded (the least recently active forgotten first) because a
client id is whatever a request's C{meta["client"]} says: a middleware that
runs for days must not keep every session it ever saw.  Which playbook a
session plays is decided here in one place because two things decide it: the
configuration gives one per character (started afresh when the session
changes character), and a client may send its own, which then wins whatever
the character.  Either way the client is told C{playbook-state}.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from twisted.logger import Logger

from rpmiddleware.builtin.playbook import wire
from rpmiddleware.builtin.playbook.model import Playbook, PlaybookError
from rpmiddleware.builtin.playbook.outbox import Outbox
from rpmiddleware.builtin.playbook.parser import parseText as parsePlaybookText
from rpmiddleware.builtin.playbook.state import SessionState


class Sessions:
    """
    @param playbooks: the configured playbook of each characterId.
    @param parse: checks a client's playbook document (against the plugin's
        tools); raises L{PlaybookError}.
    """

    log = Logger()

    def __init__(
        self,
        playbooks: Mapping[str, Playbook],
        parse: Callable[[Mapping[str, Any]], Playbook],
        outbox: Outbox,
        now: Callable[[], float],
        *,
        clientPlaybooks: bool,
        maxSessions: int,
    ) -> None:
        self.playbooks = playbooks
        self._parse = parse
        self._outbox = outbox
        self._now = now
        self.clientPlaybooks = clientPlaybooks
        self.maxSessions = maxSessions
        self._states: OrderedDict[str, SessionState] = OrderedDict()

    def __iter__(self) -> Iterator[SessionState]:
        """
        Least recently active first.
        """
        return iter(list(self._states.values()))

    def get(self, clientId: str) -> SessionState | None:
        return self._states.get(clientId)

    def isCurrent(self, state: SessionState) -> bool:
        """
        Whether C{state} is still remembered: a timer or a tool of a session
        forgotten since must not act on it.
        """
        return self._states.get(state.clientId) is state

    def active(self, clientId: str) -> SessionState:
        """
        The session C{clientId}, created if new, as the most recently active.
        """
        state = self._states.get(clientId)
        if state is None:
            state = self._states[clientId] = SessionState(clientId, self._now())
            while len(self._states) > self.maxSessions:
                _, old = self._states.popitem(last=False)
                old.stop()
                self.log.info("forgot the playbook state of session {client}", client=old.clientId)
        else:
            self._states.move_to_end(clientId)
        return state

    def choose(self, state: SessionState, characterId: str | None) -> None:
        """
        The configured playbook of the character a request is for, unless the
        client sent its own.
        """
        if state.source == "client":
            state.characterId = characterId
            return
        playbook = self.playbooks.get(characterId) if characterId is not None else None
        changed = characterId != state.characterId or playbook is not state.playbook
        state.characterId = characterId
        if changed:
            self.install(state, playbook, "config" if playbook is not None else None)

    def load(self, state: SessionState, document: Any, toml: Any) -> bool:
        """
        A client's C{playbook} message: its own playbook, or (both None) back
        to the configured one.  A refused one changes nothing and is told.

        @return: whether the session's playbook was replaced.
        """
        if not self.clientPlaybooks:
            self._outbox.error(
                state.clientId,
                "PLAYBOOK_ERROR",
                "this middleware does not take playbooks from clients "
                "(plugins.playbook.client_playbooks is false)",
            )
            return False
        if document is None and toml is None:
            configured = self.playbooks.get(state.characterId or "")
            self.install(state, configured, "config" if configured is not None else None)
            return True
        try:
            if isinstance(toml, str):
                document = parsePlaybookText(toml, "toml", "the playbook message")
            if not isinstance(document, dict):
                raise PlaybookError("playbook must be an object")
            playbook = self._parse(document)
        except PlaybookError as e:
            self.log.info(
                "refused a playbook from session {client}: {why}", client=state.clientId, why=str(e)
            )
            self._outbox.error(state.clientId, "PLAYBOOK_ERROR", str(e))
            return False
        self.install(state, playbook, "client")
        return True

    def install(self, state: SessionState, playbook: Playbook | None, source: str | None) -> None:
        had = state.playbook is not None
        state.playbook = playbook
        state.source = source
        state.fired.clear()
        state.enter(playbook.initial if playbook is not None else None, self._now())
        if playbook is not None or had:
            self.log.info(
                "session {client} plays {playbook} ({source}), stage {stage}",
                client=state.clientId,
                playbook=playbook.name if playbook is not None else None,
                source=source,
                stage=state.stage,
            )
            self._outbox.post(
                wire.toGame(
                    wire.STATE,
                    state.clientId,
                    playbook=playbook.name if playbook is not None else None,
                    stage=state.stage,
                    source=source,
                )
            )

    def forget(self, clientId: str) -> bool:
        """
        Drop C{clientId}'s state (its client session is over), its timers
        cancelled; whether there was one.
        """
        state = self._states.pop(clientId, None)
        if state is None:
            return False
        state.stop()
        return True

    def stop(self) -> None:
        for state in self._states.values():
            state.stop()
