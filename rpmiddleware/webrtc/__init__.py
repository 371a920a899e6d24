"""
WebRTC for the client endpoint: the voice-client protocol's C{offer} and
C{signal}, its data channel, the player's microphone as a track (with
voice activity detection on the server) and the character's voice as a
track back.  An optional extra: C{pip install "rpmiddleware[webrtc]"}.
C{docs/webrtc.md} is the guide.

Modules, one job each:

  - L{reactor}: is the extra installed, and choosing the asyncio reactor;
  - L{bridge}: asyncio <-> Twisted, with errbacks everywhere;
  - L{ice}: the peer's configuration and its loopback-only candidates;
  - L{peer}: one peer connection: offers, the data channel, the tracks;
  - L{microphone}: an incoming track as mono 16 kHz PCM16;
  - L{vad}: speech start and end, and each utterance's audio;
  - L{speech}: the character's voice as an outgoing track;
  - L{endpoint}: the client endpoint's C{offer} hook, and shutdown;
  - L{voice}: one client's peer joined to its client connection.

The settings are C{[webrtc]}, L{rpmiddleware.config.settings.WebRTCSettings}.  Only
L{reactor}, L{bridge}, L{vad} and L{endpoint} import without the extra; the
others need aiortc.  Nothing imports the global reactor.
"""
