"""
The console: a page at C{http://127.0.0.1:PORT/} that shows what the
middleware is doing and lets a developer try a character, and C{/metrics}.

Plain static files shipped in the package (no build step, nothing fetched
from elsewhere: the machine may be offline).  The page is a client of
C{/client/socket} like any other: what it shows comes from the C{status}
extension of the client protocol (L{rpmiddleware.client.status}), what it
tries goes through ordinary turns.

Modules, one job each:

  - L{pages}: the twisted.web resources (files, the loopback Host check);
  - L{service}: mounting the pages, the metrics and the status hub.
"""

from rpmiddleware.console.service import ConsoleService, mountConsole

__all__ = ["ConsoleService", "mountConsole"]
