"""Who may use a server of ours (`tandem serve`, `tandem ui`, `tandem ui --api`): the Host
check, the Origin check and the API key. The decisions only; `guard.py` applies them to every
request.

A web page the user opens can send requests to 127.0.0.1. The Host check stops DNS rebinding
(a page whose own name is made to resolve to this machine): only the names this server is
known by are answered. The Origin check stops cross-site requests: a browser names the page
that sent a request in `Origin`, and only the server's own origin and the origins the user
lists may use it. The key, when set, guards the API from anyone else who can reach the port.
"""
from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar
from urllib.parse import urlsplit

from app.serve.errors import AuthError, ForbiddenError
from engine.errors import SettingsError

# The settings, as the command line and the environment name them (errors name them too).
HOSTS_OPTION, HOSTS_ENV = "--allowed-hosts", "TANDEM_ALLOWED_HOSTS"
ORIGINS_OPTION, ORIGINS_ENV = "--allowed-origins", "TANDEM_ALLOWED_ORIGINS"
KEY_OPTION, KEY_FILE_OPTION, KEY_ENV = "--api-key", "--api-key-file", "TANDEM_API_KEY"

# Names that always mean this machine; a page cannot make them point at another one.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# Bound to these, the server listens on every address and is known by no name of its own.
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")
# Open without a key: it tells a supervisor whether the process serves, nothing more.
OPEN_PATHS = ("/health",)
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Access:
    host: str  # the address the server is bound to
    port: int
    # (name, port or None for any port), from --allowed-hosts.
    allowed_hosts: tuple[tuple[str, int | None], ...] = ()
    # Serialised origins ("https://tools.example:8443"), from --allowed-origins.
    allowed_origins: tuple[str, ...] = ()
    api_key: str | None = None
    # Path prefixes that need the key: every path of `tandem serve`, the /v1 routes of the app.
    keyed: tuple[str, ...] = ("/",)

    def check_host(self, host_header: str | None) -> None:
        """403 unless the request names this server as one of the names it answers to."""
        parsed = split_host(host_header or "")
        if parsed is not None:
            name, port = parsed
            if name in self.own_names() and (port or 80) == self.port:
                return
            if any(name == allowed and (want is None or port == want)
                   for allowed, want in self.allowed_hosts):
                return
        raise ForbiddenError(
            f"Host {host_header!r} is not allowed: this server answers {self.names_text()}; add "
            f"the name you use to {HOSTS_OPTION} (or {HOSTS_ENV})", code="host_not_allowed")

    def check_origin(self, origin: str | None, host_header: str) -> bool:
        """Whether the request comes from another origin the user allowed (it then gets CORS
        headers); False without an Origin or from the server's own origin; 403 otherwise."""
        if origin is None:
            return False
        normal = normal_origin(origin)
        if normal is not None and urlsplit(normal).netloc == host_header.strip().lower():
            return False
        if normal is not None and normal in self.allowed_origins:
            return True
        raise ForbiddenError(
            f"Origin {origin!r} is not allowed: this server answers pages from its own origin"
            f"{' and ' + ', '.join(self.allowed_origins) if self.allowed_origins else ''}; add "
            f"trusted origins to {ORIGINS_OPTION} (or {ORIGINS_ENV})", code="origin_not_allowed")

    def check_key(self, path: str, authorization: str | None) -> None:
        """401 when the path needs the key and the request does not carry it."""
        if self.api_key is None or path in OPEN_PATHS or not any(
                path == prefix.rstrip("/") or path.startswith(prefix.rstrip("/") + "/")
                for prefix in self.keyed):
            return
        scheme, _, given = (authorization or "").partition(" ")
        if not given.strip():
            raise AuthError("missing API key: send the header 'Authorization: Bearer KEY'",
                            headers={"WWW-Authenticate": "Bearer"})
        # Constant-time comparison: the key must not leak through response times.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                 self.api_key.encode()):
            raise AuthError("wrong API key", headers={"WWW-Authenticate": "Bearer"})

    def own_names(self) -> tuple[str, ...]:
        bound = self.host.strip("[]").lower()
        return LOOPBACK_NAMES + (() if bound in WILDCARD_ADDRESSES or bound in LOOPBACK_NAMES
                                 else (bound,))

    def names_text(self) -> str:
        names = [f"{bracketed(n)}:{self.port}" for n in self.own_names()]
        names += [bracketed(n) + (f":{p}" if p is not None else "") for n, p in self.allowed_hosts]
        return ", ".join(names)

    def notes(self) -> list[str]:
        """What the user should know at start-up about who can reach this server. Never the key."""
        lines = []
        if not is_loopback(self.host):
            lines.append(
                f"Listening on {self.host}: other machines can connect, and requests are answered "
                f"only when they name this server as {self.names_text()}. List the names and "
                f"addresses they will use with {HOSTS_OPTION} (or {HOSTS_ENV}), e.g. "
                f"{HOSTS_OPTION} tandem.lan,192.168.1.20")
            if self.api_key is None:
                lines.append(f"No API key: anyone who reaches this port can use it; set one with "
                             f"{KEY_ENV} or {KEY_FILE_OPTION}")
        if self.api_key is not None:
            where = "every route but /health" if "/" in self.keyed else "the /v1 routes"
            lines.append(f"An API key is required on {where} ('Authorization: Bearer KEY')")
        if self.allowed_origins:
            lines.append(f"Pages from {', '.join(self.allowed_origins)} may use this server")
        return lines


def bearer_token(authorization: str | None) -> str | None:
    """The key a request carries ('Authorization: Bearer KEY'), or None."""
    scheme, _, given = (authorization or "").partition(" ")
    return given.strip() or None if scheme.lower() == "bearer" else None


def split_host(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header or an --allowed-hosts entry, lower-cased, IPv6 without its
    brackets; None when it is not a host name with an optional port."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/@?# "):
        return None
    if value.startswith("["):
        name, close, rest = value[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    elif value.count(":") > 1:
        name, port_text = value, None  # a bare IPv6 address
    else:
        name, _, port_text = value.partition(":")
        port_text = port_text if ":" in value else None
    if not name:
        return None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


def normal_origin(value: str) -> str | None:
    """An origin as browsers serialise it (scheme://host[:port], lower case, no default port),
    or None when `value` is not an http(s) origin."""
    try:
        parts = urlsplit(value.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username or parts.password:
        return None
    host = bracketed(parts.hostname)
    if port is not None and port != DEFAULT_PORTS[parts.scheme]:
        host += f":{port}"
    return f"{parts.scheme}://{host}"


T = TypeVar("T")


def _parse_each(entries: Iterable[str], parse: Callable[[str], T | None],
                wrong: str) -> tuple[T, ...]:
    """Each non-blank entry parsed, or a one-line error `wrong` followed by the entry."""
    out = []
    for entry in entries:
        if not entry.strip():
            continue
        parsed = parse(entry)
        if parsed is None:
            raise SettingsError(f"{wrong}, got {entry!r}")
        out.append(parsed)
    return tuple(out)


def parse_hosts(entries: Iterable[str]) -> tuple[tuple[str, int | None], ...]:
    return _parse_each(entries, split_host,
                       f"{HOSTS_OPTION} takes host names or addresses with an optional port "
                       "(tandem.lan, 192.168.1.20:8080, [fe80::1])")


def parse_origins(entries: Iterable[str]) -> tuple[str, ...]:
    return _parse_each(entries, normal_origin,
                       f"{ORIGINS_OPTION} takes origins, scheme://host[:port] "
                       "(https://tools.example)")


def bracketed(name: str) -> str:
    return f"[{name}]" if ":" in name else name


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def display_url(host: str, port: int) -> str:
    """The URL to print for a server bound to `host`: every address means this machine too."""
    host = host.strip("[]")
    name = "localhost" if host in WILDCARD_ADDRESSES else bracketed(host)
    return f"http://{name}:{port}/"
