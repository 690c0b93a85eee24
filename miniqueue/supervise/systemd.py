"""systemd's notify protocol (``Type=notify``), without a dependency: one datagram per message
to ``$NOTIFY_SOCKET``. Outside systemd every call is a no-op."""

from __future__ import annotations

import contextlib
import os
import socket
import time


class Notifier:
    """Sends READY=1, STATUS=..., WATCHDOG=1 and STOPPING=1 to systemd when it listens."""

    def __init__(self) -> None:
        address = os.environ.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        usec = os.environ.get("WATCHDOG_USEC", "")
        # Ping at half the watchdog interval, as sd_watchdog_enabled(3) recommends.
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else None
        self._last_ping = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *fields: str) -> None:
        if not self.address:
            return
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)  # a listener that stops reading must never stall the supervisor
            sock.sendto("\n".join(fields).encode(), self.address)

    def watchdog(self) -> None:
        """Call every loop tick: pings the watchdog when one is configured and due."""
        if self.watchdog_interval is None or time.monotonic() - self._last_ping < self.watchdog_interval:
            return
        self._last_ping = time.monotonic()
        self.send("WATCHDOG=1")
