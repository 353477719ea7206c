"""Where a webhook may POST: a guard against requests the head node makes for whoever can
create a schedule (server-side request forgery).

A service that serves beyond loopback takes schedules from anyone who reaches it (with the
token). Its webhooks must not reach what only the head node can: the cloud metadata service
(169.254.169.254), the local Ray dashboard and job API (127.0.0.1:8265), or hosts of the
cluster's private network. So, when the service is exposed, every address the webhook's host
resolves to at send time must be global; the connection then goes to the address that was
checked (pinned), so a name that resolves to a public address for the check and to 127.0.0.1
for the connection (DNS rebinding) gets nowhere. `webhook_allowed_hosts` names the internal
receivers a team does want (a host name, or an address or network in CIDR form).

A loopback-only service is reached by its own host's users alone: local receivers (tests, a
chat bridge on the same machine) keep working there.

Hand-written over `ipaddress` and `socket.getaddrinfo`: the SSRF libraries on PyPI
(advocate, ssrf-filter) patch `requests`, not httpx.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket

import httpx

from service.core.exposure import serves_beyond_loopback

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class DestinationRefused(ValueError):
    """The webhook's host is internal and not allow-listed (the message says which address
    and how to allow it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """Which destinations a webhook may reach."""

    exposed: bool
    """The service serves beyond loopback: internal destinations are refused."""
    allowed: tuple[str, ...] = ()
    """Host names, addresses or CIDR networks reachable even though they are internal."""

    @classmethod
    def from_settings(cls, settings) -> WebhookPolicy:
        return cls(exposed=serves_beyond_loopback(settings.served_host),
                   allowed=tuple(settings.webhook_allowed_hosts))

    def _allows(self, host: str, address: Address) -> bool:
        for entry in self.allowed:
            if entry == host:
                return True
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue  # a host name that is not this one
        return False


def _internal(address: Address) -> str | None:
    """What makes `address` internal (loopback, link-local, private, …), None if global."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    for what in ("loopback", "link_local", "unspecified", "multicast", "private", "reserved"):
        if getattr(address, f"is_{what}"):
            return what.replace("_", "-")
    return None if address.is_global else "not global"


def resolve(host: str, port: int) -> list[Address]:
    """Every address `host` resolves to now (an address literal: itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


def pinned_request(url: str, policy: WebhookPolicy) -> tuple[str, dict[str, str], dict]:
    """(the URL to connect to, extra headers, httpx extensions) for a POST to `url` under
    `policy`: unchanged on a loopback-only service; when exposed, the URL with its host
    replaced by the checked address, the original Host header and TLS name kept.
    DestinationRefused naming the internal address; OSError when the name does not resolve."""
    if not policy.exposed:
        return url, {}, {}
    parsed = httpx.URL(url)
    host, port = parsed.host.lower(), parsed.port or (443 if parsed.scheme == "https" else 80)
    addresses = resolve(host, port)
    for address in addresses:
        why = _internal(address)
        if why is not None and not policy._allows(host, address):
            raise DestinationRefused(
                f"refused: the webhook's host {host} resolves to {address} ({why}), and this "
                "service serves beyond loopback, where a webhook may reach only global "
                "addresses (the cloud metadata service, Ray's dashboard and the cluster's own "
                f"hosts are internal); name it in GDN_SWEEP_WEBHOOK_ALLOWED_HOSTS ("
                + (host if host == str(address) else f"{host} or {address}")
                + ") if it is a receiver of yours")
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return str(parsed.copy_with(host=str(addresses[0]))), {"Host": parsed.netloc.decode()}, \
        extensions


__all__ = ["DestinationRefused", "WebhookPolicy", "pinned_request", "resolve"]
