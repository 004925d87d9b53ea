"""Start URLs as a browser reads them: the one policy for every URL a task or an import names.

A task's start URL is opened by a browser on the collection machine, so it is read the way the
browser reads it (the WHATWG URL standard, through ``ada_url``, the parser of Node.js), not the
way :func:`urllib.parse.urlsplit` does (RFC 3986). The two disagree exactly where it matters:
``http://example.com\\@evil.com/`` is ``evil.com`` to ``urlsplit`` and ``example.com`` to a
browser (a backslash is a path separator in http(s)); tabs and newlines are dropped
(``http://exa<TAB>mple.com``), ``0xA9.0xFE.0xA9.0xFE`` and ``2852039166`` are 169.254.169.254,
``%41`` in a host is ``a``. So :func:`parse_web_url` stores what the browser will visit (the
parse's serialisation, :attr:`WebUrl.href`) and takes the host and origin from that same parse.

What is refused, and why:

- anything but ``http:`` / ``https:`` (``file:``, ``javascript:``, ``data:``, ``chrome:`` …);
- what the standard does not parse (spaces or other forbidden code points in the host, a bad
  port, a bad IPv4 or IPv6 literal);
- a user name or password (``http://user:pw@host/``): a phishing form, and a secret in a row
  that is exported with datasets;
- always: link-local addresses (169.254.0.0/16, fe80::/10, also inside an IPv4-mapped or NAT64
  IPv6 address) and cloud metadata endpoints (``metadata.google.internal``, 100.100.100.200 …):
  an agent browsing there reads the collection machine's cloud credentials;
- unless ``allow_private=True``: loopback, private, shared, reserved and unspecified addresses
  (127.0.0.0/8, 10/8, 172.16/12, 192.168/16, 100.64/10, 0.0.0.0, ``[::1]``, fc00::/7 …) and
  names that never reach the public internet (``localhost`` and ``*.localhost``, one-label names
  such as ``intranet``, ``*.local``, ``*.internal``, ``*.home.arpa``): a third-party task file
  must not point the agent at services on the collection machine or its network. The bundled
  sites' tasks start at ``bundled://<site>/…``, resolved to the local server when a run starts,
  and that server's own origins are admitted (:func:`vet_start_url`), so refusing loopback costs
  them nothing.

Host names are not resolved here: a public name whose DNS answer is private is stopped where the
name is resolved, by the rollout browser's proxy (:mod:`rollouts.proxy`), which vets every address
a name resolves to with :func:`address_problem` (the same rules) and dials only vetted addresses.

The policy holds at every door, not only at import: a task can also arrive through write-mode
SQL, a team catalog or ``warehouse copy``, so the collect stage re-checks each start URL with
:func:`vet_start_url` before any browser work (the running bundled sites' own origins admitted).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from ada_url import URL, HostType

SCHEMES = ("http", "https")

METADATA_HOSTS = frozenset(
    {
        "metadata.google.internal",  # GCP
        "metadata.goog",  # GCP
        "metadata",  # GCP, through the resolver's search domain
        "instance-data",  # AWS, through the search domain
        "instance-data.ec2.internal",  # AWS
    }
)
METADATA_ADDRESSES = frozenset(
    {
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
        ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
    }
)
LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".home.arpa")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UrlRefused(ValueError):
    """A URL a task may not start at; the message says why (for the import report)."""


class NotAWebUrl(UrlRefused):
    """Not an http(s) URL at all (no string, does not parse, another scheme, no host), as
    opposed to a web URL that the policy refuses."""


@dataclass(frozen=True)
class WebUrl:
    """An http(s) URL as a browser parses it."""

    href: str  # the serialisation: what the browser visits, and what is stored
    origin: str  # scheme://host[:port], the default port left out
    host: str  # lower-case, IDNA (punycode), IPv4 dotted, IPv6 in brackets


def parse_web_url(value: str, *, allow_private: bool = False) -> WebUrl:
    """Parse ``value`` as a browser would and apply the policy of the module docstring; raise
    :class:`UrlRefused` with the reason. ``allow_private`` admits loopback and private hosts
    (never link-local or metadata ones), for task files one wrote for a local site."""
    if not isinstance(value, str):
        raise NotAWebUrl(f"not a string: {type(value).__name__}")
    try:
        url = URL(value)
    except ValueError:
        raise NotAWebUrl("not a URL a browser can open (WHATWG URL parsing fails)") from None
    scheme = url.protocol.removesuffix(":")
    if scheme not in SCHEMES:
        raise NotAWebUrl(f"the scheme {scheme!r} is not http or https")
    if not url.hostname:
        raise NotAWebUrl("no host")
    if url.username or url.password:
        raise UrlRefused("it holds a user name or password (user:password@host)")
    problem = host_problem(url.hostname, url.host_type, allow_private=allow_private)
    if problem:
        raise UrlRefused(f"the host {url.hostname} is {problem}")
    return WebUrl(href=url.href, origin=url.origin, host=url.hostname)


def host_problem(host: str, host_type: HostType, *, allow_private: bool = False) -> str | None:
    """Why a parsed host may not be a start URL's, or ``None``: see the module docstring."""
    if host_type == HostType.DEFAULT:
        return _name_problem(host.rstrip("."), allow_private)
    return address_problem(ipaddress.ip_address(host.strip("[]")), allow_private=allow_private)


def address_problem(ip: IPAddress, *, allow_private: bool = False) -> str | None:
    """Why an agent's browser may not reach address ``ip`` (a host's own, or one its name
    resolves to), or ``None``: link-local and cloud metadata addresses never, loopback, private
    and reserved ones only with ``allow_private`` (also inside an IPv4-mapped, NAT64 or 6to4
    IPv6 address)."""
    embedded = _embedded_ipv4(ip)
    addresses = [ip] if embedded is None else [ip, embedded]
    if any(a.is_link_local or a in METADATA_ADDRESSES for a in addresses):
        return "a link-local or cloud metadata address"
    if allow_private or all(a.is_global for a in addresses):
        return None
    return "a loopback, private or reserved address (not on the public internet)"


def vet_start_url(
    value: str, *, local_origins: Iterable[str] = (), allow_private: bool = False
) -> WebUrl:
    """A stored start URL checked again before a browser opens it (a task may have bypassed the
    import: write-mode SQL, a team catalog, ``warehouse copy``): :func:`parse_web_url`'s policy,
    where ``local_origins`` (the running bundled sites' own, e.g. ``http://127.0.0.1:41234``)
    are admitted on loopback without ``allow_private``. Raises :class:`UrlRefused`."""
    url = parse_web_url(value, allow_private=True)  # never link-local, metadata, credentials
    if url.origin in set(local_origins):
        return url
    return parse_web_url(value, allow_private=allow_private)


def _name_problem(name: str, allow_private: bool) -> str | None:
    if name in METADATA_HOSTS:
        return "a cloud metadata endpoint"
    if allow_private:
        return None
    if name == "localhost" or name.endswith(LOCAL_SUFFIXES):
        return "a local name (not on the public internet)"
    if "." not in name:
        return "a one-label name (resolved on the local network, not on the public internet)"
    return None


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries to the same host: IPv4-mapped, NAT64, 6to4."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour
