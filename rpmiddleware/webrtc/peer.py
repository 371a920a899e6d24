"""
One WebRTC peer connection per client session.

L{Peer} is the server's half of the voice-client protocol's WebRTC part:

  - C{offer} -> L{Peer.answer} -> the SDP answer, the C{signal} message's
    payload.  Later offers on the same peer (renegotiation: the LLMRTC
    client first offers only its data channel, then offers again when it
    adds the microphone) are answered the same way, one at a time, in order.
    The answer is complete (the client does not trickle, and neither do
    we): its candidates are loopback host candidates only (L{ice}).
  - The data channel the client opens (LLMRTC names it C{data}; any label
    is accepted): L{Peer.send} writes a JSON text message on it once open;
    every text message received is handed to C{onMessage} as it came.
  - The client's microphone: each incoming audio track is read by a
    L{MicrophoneReader} into mono 16 kHz PCM16 for C{onAudio}.
  - The character's voice: L{Peer.speech}, a L{SpeechTrack}, rides on the
    client's audio m-line when the client can receive on it (C{sendrecv},
    what C{addTrack} offers); L{Peer.speaking} says whether it was
    negotiated, so the caller knows whether audio must go as messages.
  - L{Peer.close}: on disconnect, at shutdown, or when ICE fails.

The public methods return Deferreds (the client endpoint is Twisted code);
the work runs as asyncio tasks on the reactor's loop (L{bridge}).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.rtcdatachannel import RTCDataChannel
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from rpmiddleware.protocol.envelope import jsonBytes
from rpmiddleware.webrtc.bridge import deferredFromCoroutine, guarded, logFailure, spawn
from rpmiddleware.webrtc.ice import loopbackGathering, peerConfiguration
from rpmiddleware.webrtc.microphone import MicrophoneReader
from rpmiddleware.webrtc.speech import SpeechTrack

#: The seed's error codes a refused offer is answered with.
INVALID_MESSAGE = "INVALID_MESSAGE"
CONNECTION_FAILED = "CONNECTION_FAILED"

#: The close reason when ICE or DTLS fails (the client is told CONNECTION_FAILED).
ICE_FAILED = "ICE or DTLS failed"

#: The largest SDP accepted (a real offer is a few kilobytes).
MAX_SDP_CHARS = 64 * 1024


class OfferRefused(Exception):
    """
    An offer that cannot be answered; C{code} is the seed's error code for
    the client's C{error} message, C{message} says why.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class PeerOptions:
    #: The configured STUN/TURN servers (the C{ready} message's shape).
    iceServers: Sequence[Mapping[str, Any]] = ()
    #: The loopback addresses to gather on (L{ice.loopbackAddresses}).
    addresses: Sequence[str] = ("127.0.0.1",)
    #: Bytes queued on the data channel beyond which the client counts as
    #: not reading it: the peer is closed (the WebSocket carries on).
    maxDataBacklog: int = 8 * 1024 * 1024
    #: Seconds an offer may take to answer before it is refused.
    answerTimeout: float = 15.0
    speechFactory: Callable[[], SpeechTrack] = field(default=SpeechTrack)


def checkOffer(signal: Any) -> RTCSessionDescription:
    """
    The C{signal} field of an C{offer} message as a session description.

    @raise OfferRefused: INVALID_MESSAGE, naming what is wrong.
    """
    if not isinstance(signal, Mapping):
        raise OfferRefused(INVALID_MESSAGE, "offer.signal must be an object {type, sdp}")
    kind, sdp = signal.get("type"), signal.get("sdp")
    if kind != "offer":
        raise OfferRefused(
            INVALID_MESSAGE,
            f"offer.signal.type must be 'offer' (the server answers, it never offers), "
            f"got {kind!r}",
        )
    if not isinstance(sdp, str) or not sdp.strip():
        raise OfferRefused(INVALID_MESSAGE, "offer.signal.sdp must be a non-empty SDP string")
    if len(sdp) > MAX_SDP_CHARS:
        raise OfferRefused(INVALID_MESSAGE, f"offer.signal.sdp is over {MAX_SDP_CHARS} characters")
    lines = sdp.strip().splitlines()
    if not lines[0].startswith("v=0"):
        raise OfferRefused(INVALID_MESSAGE, "offer.signal.sdp is not SDP (it must begin with v=0)")
    if not any(line.startswith("m=") for line in lines):
        raise OfferRefused(
            INVALID_MESSAGE, "offer.signal.sdp has no media section (m=): nothing to connect"
        )
    return RTCSessionDescription(sdp=sdp, type="offer")


class Peer:
    """
    The server's peer connection for one client session.
    """

    log = Logger()

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        options: PeerOptions | None = None,
        onMessage: Callable[[str], None] | None = None,
        onAudio: Callable[[bytes], None] | None = None,
        onChannelOpen: Callable[[], None] | None = None,
        onClosed: Callable[[str], None] | None = None,
        label: str = "",
    ) -> None:
        self.loop = loop
        self.options = options or PeerOptions()
        self.onMessage = onMessage
        self.onAudio = onAudio
        self.onChannelOpen = onChannelOpen
        self.onClosed = onClosed
        self.label = label
        self.pc = RTCPeerConnection(peerConfiguration(self.options.iceServers))
        self.speech = self.options.speechFactory()
        self.channel: RTCDataChannel | None = None
        self.readers: list[MicrophoneReader] = []
        self.offers = 0
        self.closed = False
        self.closeReason = ""
        self._lock = asyncio.Lock()
        self._finished = False
        self._waiters: list[Deferred[None]] = []
        self.pc.on("datachannel", guarded(self._datachannel, "data channel"))
        self.pc.on("track", guarded(self._track, "incoming track"))
        self.pc.on("connectionstatechange", guarded(self._stateChanged, "state change"))

    # Offers.

    def answer(self, signal: Any) -> Deferred[dict[str, str]]:
        """
        Answer an offer (the C{signal} of an C{offer} message).

        @return: fires with the answer, C{{"type": "answer", "sdp": ...}};
            fails with L{OfferRefused}.
        """
        try:
            offer = checkOffer(signal)
        except OfferRefused as e:
            return fail(e)
        return deferredFromCoroutine(self._answer(offer), self.loop)

    async def _answer(self, offer: RTCSessionDescription) -> dict[str, str]:
        async with self._lock:
            if self.closed:
                raise OfferRefused(CONNECTION_FAILED, "the peer connection is closed")
            try:
                return await asyncio.wait_for(self._negotiate(offer), self.options.answerTimeout)
            except OfferRefused:
                raise
            except TimeoutError:
                raise OfferRefused(
                    CONNECTION_FAILED,
                    f"the offer could not be answered within {self.options.answerTimeout:g} s",
                )
            except ValueError as e:
                # aiortc's word for an SDP it cannot use.
                raise OfferRefused(INVALID_MESSAGE, f"the offer's SDP cannot be used: {e}")
            except Exception as e:
                self.log.failure("WebRTC {label}: answering an offer failed", label=self.label)
                raise OfferRefused(CONNECTION_FAILED, f"the offer could not be answered: {e}")

    async def _negotiate(self, offer: RTCSessionDescription) -> dict[str, str]:
        pc = self.pc
        await pc.setRemoteDescription(offer)
        self._attachSpeech()
        answer = await pc.createAnswer()
        with loopbackGathering(pc, self.options.addresses):
            await pc.setLocalDescription(answer)
        self.offers += 1
        local = pc.localDescription
        return {"type": local.type, "sdp": local.sdp}

    def _attachSpeech(self) -> None:
        """
        Put the speech track on the first audio transceiver, once there is one.
        """
        if any(t.sender.track is self.speech for t in self.pc.getTransceivers()):
            return
        if any(t.kind == "audio" for t in self.pc.getTransceivers()):
            self.pc.addTrack(self.speech)

    @property
    def speaking(self) -> bool:
        """
        Whether the speech track was negotiated for sending to the client.
        """
        for t in self.pc.getTransceivers():
            if t.sender.track is self.speech:
                return t.currentDirection in ("sendrecv", "sendonly")
        return False

    @property
    def connectionState(self) -> str:
        return str(self.pc.connectionState)

    # The data channel.

    def _datachannel(self, channel: RTCDataChannel) -> None:
        self.channel = channel
        channel.on("message", guarded(self._message, "data channel message"))
        channel.on("close", guarded(lambda: self._channelClosed(channel), "data channel close"))
        if channel.readyState == "open":
            self._channelOpened()
        else:
            channel.on("open", guarded(self._channelOpened, "data channel open"))

    def _channelOpened(self) -> None:
        if self.onChannelOpen is not None:
            self.onChannelOpen()

    def _channelClosed(self, channel: RTCDataChannel) -> None:
        if self.channel is channel:
            self.channel = None

    def _message(self, data: str | bytes) -> None:
        if self.onMessage is None:
            return
        if isinstance(data, bytes):
            # The protocol is JSON text; a binary message is passed on as
            # text if it decodes, so the endpoint's checks answer it.
            data = data.decode("utf-8", errors="replace")
        self.onMessage(data)

    @property
    def channelOpen(self) -> bool:
        return self.channel is not None and self.channel.readyState == "open"

    def send(self, message: Mapping[str, Any]) -> bool:
        """
        Send one JSON message on the data channel if it is open.

        @return: whether it was sent.
        """
        channel = self.channel
        if self.closed or channel is None or channel.readyState != "open":
            return False
        if channel.bufferedAmount > self.options.maxDataBacklog:
            self.log.warn(
                "WebRTC {label}: the client is not reading its data channel "
                "({amount} bytes queued); closing the peer connection",
                label=self.label,
                amount=channel.bufferedAmount,
            )
            self.close("data channel backlog")
            return False
        try:
            # Text, as on the WebSocket; a lone surrogate is escaped, not lost.
            channel.send(jsonBytes(message).decode("utf-8"))
        except ValueError as e:
            # Over the client's a=max-message-size (64 KiB unless it says
            # more): a non-streaming tts WAV can be.  The WebSocket has it.
            self.log.warn(
                "WebRTC {label}: a {type} message was not sent on the data channel: {why}",
                label=self.label,
                type=message.get("type"),
                why=str(e),
            )
            return False
        return True

    # Tracks.

    def _track(self, track: Any) -> None:
        """
        A new incoming audio track: it becomes the microphone.  One is read
        at a time (two interleaved would be noise to the detector), so an
        older one is stopped.
        """
        if track.kind != "audio":
            return
        for old in self.readers:
            spawn(old.stop(), self.loop, "stopping an older microphone")
        reader = MicrophoneReader(track, self._pcm)
        self.readers = [reader]
        reader.start(self.loop).add_done_callback(self._readerDone)

    def _readerDone(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.failure(
                "WebRTC {label}: reading the microphone failed",
                Failure(task.exception()),
                label=self.label,
            )

    def _pcm(self, pcm: bytes) -> None:
        if self.onAudio is not None and not self.closed:
            self.onAudio(pcm)

    # State and closing.

    def _stateChanged(self) -> None:
        state = self.pc.connectionState
        if state == "failed":
            self.close(ICE_FAILED)
        elif state == "closed" and not self.closed:
            self.close("closed by the client")

    def close(self, reason: str = "closed") -> Deferred[None]:
        """
        Close the peer connection (idempotent): C{onClosed} is called once,
        at once; the Deferred fires when aiortc has closed everything.
        """
        if not self.closed:
            self.closed = True
            self.closeReason = reason
            closing = deferredFromCoroutine(self._close(), self.loop)
            closing.addErrback(logFailure, f"closing the peer of {self.label or 'a client'}")
            closing.addBoth(self._closedNow)
            callback, self.onClosed = self.onClosed, None
            if callback is not None:
                callback(reason)
        if self._finished:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def _closedNow(self, _: object) -> None:
        self._finished = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(None)

    async def _close(self) -> None:
        self.speech.stop()
        for reader in self.readers:
            await reader.stop()
        await self.pc.close()
