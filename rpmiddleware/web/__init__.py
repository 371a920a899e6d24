"""
Serving on the loopback port: the site's resource tree (C{site}), the
guarded WebSocket both endpoints use (C{websocket}: origins, limits,
TCP_NODELAY), and reading clients' whole frames (C{framereader},
C{framemask}).
"""
