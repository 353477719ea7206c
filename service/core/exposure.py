"""Whether the service can be reached from other machines: what its safety rules depend on
(a token required to serve, webhooks kept off internal addresses)."""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def serves_beyond_loopback(host: str) -> bool:
    """Whether a service bound to `host` can be reached from other machines (0.0.0.0 and any
    name other than localhost: yes)."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: whatever it resolves to, treat it as reachable
        return True


def refusal_to_serve(host: str) -> str:
    """What a command that would serve `host` beyond loopback without a token says, exiting 2."""
    return (f"refusing to serve {host} (beyond loopback) without a token: anyone who reaches "
            "the port could start and cancel sweeps on this cluster. Set GDN_SWEEP_API_TOKEN "
            "(mutating calls then need 'Authorization: Bearer <token>'; "
            "GDN_SWEEP_TOKEN_FOR_READS=true puts reads behind it too), or pass "
            "--allow-unauthenticated to serve it open on purpose.")
