"""
The engine end: RPEngine's two transports, both feeding one link.

  - L{link}: which RPEngine session is live, and what happens to work when
    there is none (the chain's engine end);
  - L{session}: one RPEngine session over any transport: handshake,
    validation, duplicates, acks, retransmission;
  - L{websocket}: the WebSocket transport (Autobahn), C{/rp-engine/socket};
  - L{queue}: which request RPEngine works on now (for the client's stall
    rule);
  - L{mailbox}: the file transport, a folder RPEngine polls.
"""
