"""
The client endpoint: the voice-client wire protocol v1 (LLMRTC's message set)
served at C{/client/socket}, each turn bridged to RPEngine through the
middleware's Python API and plugin chain.  C{docs/client-protocol.md} is the
reference for client authors.

Modules, one job each:

  - L{settings}: the C{[client]} settings and the default character;
  - L{messages}: checking client messages, building server ones;
  - L{decode}: WAV, WebM/Opus and Ogg/Opus recordings to PCM;
  - L{sessions}: sessions, history and their TTL;
  - L{tts}: one reply's speech at the client's rate, streamed or as a WAV;
  - L{turns}: one turn's reply stream as client messages;
  - L{capacity}: the C{capacity} message (the endpoint's monitor, and each
    connection's notices at a bounded rate);
  - L{attachments}: images for an RPEngine that takes none;
  - L{clientext}: plugins' messages to clients, and the turns they ask for
    (the chain's half is L{rpmiddleware.plugin.clientext});

one connection, composed in L{connection} of

  - L{inbox}: its messages, one at a time in order;
  - L{flow}: bounding what a slow client costs;
  - L{turnqueue}: one turn at a time, barge-in or a bounded queue;
  - L{resume}: taking over a session after a reconnect;

the message handlers, each given a L{surface.ClientSurface}:

  - L{turnmessages}: C{text}, C{audio}, C{voice-capture}, C{cancel};
  - L{character}: C{character} and C{configure};
  - L{reconnect}: C{reconnect};
  - L{status}: the C{status} extension;

and the endpoint:

  - L{endpoint}: what a connection is given (its writer, the shared parts,
    the dispatch table);
  - L{websocket}: the Autobahn protocol and factory.

The client protocol's error codes and field checks are protocol knowledge
the core and plugins share: L{rpmiddleware.protocol.clienterrors} and
L{rpmiddleware.protocol.clientfields}.
"""

from rpmiddleware.client.settings import ClientSettings
from rpmiddleware.client.websocket import ClientFactory, ClientProtocol

__all__ = ["ClientFactory", "ClientProtocol", "ClientSettings"]
