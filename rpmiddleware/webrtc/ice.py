"""
ICE for a server that lives on loopback: configuration and candidates.

rpmiddleware listens only on the loopback interface, and its WebRTC peer
must too: the answer may offer only loopback host candidates, or the
middleware would open UDP ports on the machine's real interfaces.

aioice (aiortc's ICE) gathers host candidates from
C{aioice.ice.get_host_addresses()}, which lists every interface address
*except* 127.0.0.1 (a sensible default for the internet, where loopback is
useless).  Left alone, our answer would offer the LAN addresses and no
loopback one.  The narrowest fix that stays within aioice's own structure:

  - L{installLoopbackGathering} wraps C{aioice.ice.get_host_addresses} once
    per process.  The wrapper returns the loopback addresses when the
    context variable L{_LOOPBACK} is set, and otherwise calls the original,
    so every other aioice user in the process (a test's aiortc client, an
    embedding program's own peers) is untouched.
  - L{loopbackGathering} sets that variable around our own
    C{setLocalDescription}, which is where aiortc gathers.  Context
    variables follow the asyncio tasks created inside (aiortc gathers each
    transport in a child task), and end with the block.
  - The same block clears the STUN and TURN servers of the connections it
    gathers for (L{_withoutServers}): server-reflexive and relayed
    candidates are never loopback, and asking an outside server from a
    loopback socket can only fail or time out.

The configured C{iceServers} still go into C{ready} for the client, whose
view of the network they describe, and into the server's
C{RTCConfiguration}: that keeps aiortc from falling back to its built-in
default (a public Google STUN server) when none is configured.
"""

from __future__ import annotations

import contextvars
import ipaddress
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

_LOOPBACK: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "rpmiddleware_webrtc_loopback", default=None
)
_MARK = "_rpmiddleware_loopback"


def loopbackAddresses(interface: str) -> tuple[str, ...]:
    """
    The address to gather on for a listener on C{interface}: the interface
    itself when it is a loopback address, 127.0.0.1 otherwise (localhost).
    """
    try:
        address = ipaddress.ip_address(interface.strip("[]"))
    except ValueError:
        return ("127.0.0.1",)
    if address.is_loopback:
        return (str(address),)
    return ("127.0.0.1",)


def installLoopbackGathering() -> None:
    """
    Wrap C{aioice.ice.get_host_addresses} (once; later calls do nothing).
    """
    import aioice.ice

    original = aioice.ice.get_host_addresses
    if getattr(original, _MARK, False):
        return

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        loopback = _LOOPBACK.get()
        if loopback is None:
            return original(use_ipv4=use_ipv4, use_ipv6=use_ipv6)
        return [
            a
            for a in loopback
            if (use_ipv4 and ipaddress.ip_address(a).version == 4)
            or (use_ipv6 and ipaddress.ip_address(a).version == 6)
        ]

    setattr(get_host_addresses, _MARK, True)
    aioice.ice.get_host_addresses = get_host_addresses


def _gatherers(pc: RTCPeerConnection) -> Iterator[Any]:
    """
    The ICE gatherers of C{pc}'s transports, through aiortc's public API.
    """
    seen: set[int] = set()
    transports = [t.sender.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    for dtls in transports:
        gatherer = getattr(getattr(dtls, "transport", None), "iceGatherer", None)
        if gatherer is not None and id(gatherer) not in seen:
            seen.add(id(gatherer))
            yield gatherer


def _withoutServers(pc: RTCPeerConnection) -> None:
    """
    No STUN or TURN for the gatherers that have not gathered yet.  aiortc
    keeps the aioice connection in C{RTCIceGatherer._connection}; its
    C{stun_server} and C{turn_server} are aioice's public attributes.
    """
    for gatherer in _gatherers(pc):
        connection = getattr(gatherer, "_connection", None)
        if connection is not None and gatherer.state == "new":
            connection.stun_server = None
            connection.turn_server = None


@contextmanager
def loopbackGathering(pc: RTCPeerConnection, addresses: Sequence[str]) -> Iterator[None]:
    """
    Within the block, C{pc} gathers host candidates on C{addresses} only,
    and no server-reflexive or relayed ones.  Wrap C{setLocalDescription}.
    """
    installLoopbackGathering()
    _withoutServers(pc)
    token = _LOOPBACK.set(tuple(addresses))
    try:
        yield
    finally:
        _LOOPBACK.reset(token)


def iceServer(server: Mapping[str, Any]) -> RTCIceServer:
    """
    One configured server (the C{ready} message's shape) for aiortc.
    """
    return RTCIceServer(
        urls=server["urls"],
        username=server.get("username"),
        credential=server.get("credential"),
    )


def peerConfiguration(iceServers: Sequence[Mapping[str, Any]] = ()) -> RTCConfiguration:
    """
    The C{RTCConfiguration} of a server peer: the configured servers, and an
    explicit empty list when there are none (aiortc's default is Google's
    public STUN server).
    """
    return RTCConfiguration(iceServers=[iceServer(s) for s in iceServers])


def candidateAddresses(sdp: str) -> list[str]:
    """
    The connection addresses of the C{a=candidate} lines of an SDP.
    """
    found = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            parts = line.split()
            if len(parts) >= 5:
                found.append(parts[4])
    return found
