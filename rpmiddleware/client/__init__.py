"""
The client endpoint: the voice-client wire protocol v1 (LLMRTC's message set)
served at C{/client/socket}, each turn bridged to RPEngine through the
middleware's Python API and plugin chain.  C{docs/client-protocol.md} is the
reference for client authors.

Modules, one job each:

  - L{settings}: the C{[client]} settings and the default character;
  - L{messages}: checking client messages, building server ones;
  - L{errors}: the client error codes and RPEngine's mapped onto them;
  - L{decode}: WAV, WebM/Opus and Ogg/Opus recordings to PCM;
  - L{sessions}: sessions, history and their TTL;
  - L{tts}: one reply's speech at the client's rate, streamed or as a WAV;
  - L{turns}: one turn's reply stream as client messages;
  - L{flow}: bounding what a slow client costs;
  - L{capacity}: the C{capacity} message;
  - L{attachments}: images for an RPEngine that takes none;
  - L{playbook}: the playbook and game-event messages, and the playbook plugin's replies;
  - L{endpoint}: what a connection is given (its writer, the shared parts);
  - L{connection}: one client's messages, session and turns;
  - L{protocol}: the Autobahn protocol and factory.
"""

from rpmiddleware.client.protocol import ClientFactory, ClientProtocol
from rpmiddleware.client.settings import ClientSettings

__all__ = ["ClientFactory", "ClientProtocol", "ClientSettings"]
