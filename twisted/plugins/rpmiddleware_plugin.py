"""
The twistd drop-in: makes C{twistd rpmiddleware} available.

Kept tiny on purpose: twistd imports every drop-in to list them, so the real
work is imported only when the service is made.
"""

from twisted.application.service import ServiceMaker

rpmiddleware = ServiceMaker(
    "rpmiddleware",
    "rpmiddleware.tap",
    "Local middleware between games and RPEngine (WebSocket listener with a plugin chain).",
    "rpmiddleware",
)
