"""Logins to the dashboard per client address: a growing wait after repeated failures, and
which admitted requests start a login (for the audit log).

HTTP Basic sends the credentials with every request. A failure is a request whose credentials
are wrong; after :data:`FREE_FAILURES` of them in a row, the address must wait before its next
attempt: :data:`FIRST_WAIT` seconds, twice as long after each further failure, at most
:data:`MAX_WAIT`. A success clears the count. IPv6 addresses count per /64, the block one host
usually holds. The state lives in this process's memory and is bounded: at most
:data:`MAX_ADDRESSES` addresses, the least recently seen forgotten first.

Times are the caller's (``time.monotonic()``), passed in, so the rules are plain arithmetic.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

FREE_FAILURES = 5
FIRST_WAIT = 1.0
MAX_WAIT = 300.0
MAX_ADDRESSES = 10_000
#: An admitted request starts a new login when its address was last admitted as another
#: user, or this many seconds ago, or failed in between.
LOGIN_IDLE = 1800.0


@dataclass
class _Address:
    failures: int = 0
    retry_at: float = 0.0
    user: str | None = None  # the user it was last admitted as
    admitted_at: float = 0.0


class LoginThrottle:
    """Failed logins per client address, and the wait they impose (see the module's docstring)."""

    def __init__(
        self,
        *,
        free_failures: int = FREE_FAILURES,
        first_wait: float = FIRST_WAIT,
        max_wait: float = MAX_WAIT,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        self.free_failures, self.first_wait, self.max_wait = free_failures, first_wait, max_wait
        self.max_addresses = max_addresses
        self._addresses: OrderedDict[str, _Address] = OrderedDict()

    @property
    def tracked(self) -> int:
        """How many client addresses it remembers."""
        return len(self._addresses)

    def retry_after(self, address: str, now: float) -> float:
        """Seconds ``address`` must still wait before its credentials are checked (0: none)."""
        entry = self._addresses.get(client_key(address))
        return max(0.0, entry.retry_at - now) if entry else 0.0

    def failed(self, address: str, now: float) -> tuple[int, float]:
        """Count a failed login from ``address``: its failures in a row, and the seconds it must
        now wait before the next attempt (0 while under :data:`FREE_FAILURES`)."""
        entry = self._touch(address)
        entry.failures += 1
        extra = entry.failures - self.free_failures
        wait = 0.0 if extra < 0 else min(self.max_wait, self.first_wait * 2.0 ** min(extra, 64))
        entry.retry_at = now + wait
        return entry.failures, wait

    def admitted(self, address: str, user: str, now: float) -> tuple[bool, int]:
        """Clear ``address``'s failures as ``user`` is admitted: whether this starts a login
        (see :data:`LOGIN_IDLE`), and how many failures it cleared."""
        entry = self._touch(address)
        cleared = entry.failures
        new = cleared > 0 or entry.user != user or now - entry.admitted_at >= LOGIN_IDLE
        entry.failures, entry.retry_at, entry.user, entry.admitted_at = 0, 0.0, user, now
        return new, cleared

    def _touch(self, address: str) -> _Address:
        key = client_key(address)
        entry = self._addresses.pop(key, None) or _Address()
        self._addresses[key] = entry  # the most recently seen last
        while len(self._addresses) > self.max_addresses:
            self._addresses.popitem(last=False)
        return entry


def client_key(address: str) -> str:
    """What failures are counted under: the IPv4 address, the /64 of an IPv6 one, else the text."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
