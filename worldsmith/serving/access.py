"""Who may call the gateway: the Host and Origin a request names, and a bearer token when one is set.

What the MCP specification asks of an HTTP server (transports, security warning): a server on this
machine answers only requests that name it, so a web page cannot reach it through a DNS name its
author points at 127.0.0.1 (DNS rebinding), and it can require callers to authenticate.

- Host: the loopback names (`localhost`, `127.0.0.1`, `[::1]`) with the gateway's port, the address
  it was bound to (unless a wildcard) with its port, and the names added (`allowed_hosts`: `NAME`
  on any port, `NAME:PORT` on that one). Anything else is 403, as is a request without one.
- Origin (what browsers send): absent, or `http://` or `https://` and an allowed Host; else 403.
- token (optional): `Authorization: Bearer <token>`, compared in constant time; without it, or with
  another, 401 and `WWW-Authenticate: Bearer` (RFC 6750).

A WebSocket's handshake (OpenEnv's sessions, serving/openenv.py) is checked as any request: browsers
let any page open a WebSocket to any host, so its Origin check is what keeps pages of other sites out;
a refused handshake is closed before it is accepted (HTTP 403 to the client).

`/healthz` answers anyone: it says only that the gateway is up. The port is the one the request
came in on. A request that came over a Unix socket (`env serve --processes N`: a gateway process's own,
mode 0600 in a private directory, where the others relay requests they checked) is not checked for
Host and Origin: no browser reaches a Unix socket; its token is checked as any.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from worldsmith.failures import UserFixable
from worldsmith.serving import hotpath

#: The names of this machine a loopback client uses.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: Addresses that bind every interface: no client names them.
_WILDCARDS = frozenset({"0.0.0.0", "::", "[::]"})
_OPEN_PATHS = frozenset({"/healthz"})
_HOST, _ORIGIN, _AUTHORIZATION = b"host", b"origin", b"authorization"


class AccessRefused(UserFixable, ValueError):
    """An allowed host or a token file the gateway cannot use (the message names the fix)."""


def read_token_file(path: Path) -> str:
    """The bearer token in file `path` (surrounding whitespace dropped); AccessRefused for a file that
    cannot be read, is empty, or holds what a header cannot carry."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "it is not UTF-8 text"
        raise AccessRefused(f"cannot read the token file {path}: {reason}; check --token-file") from None
    if not token:
        raise AccessRefused(f"the token file {path} is empty: write a token into it (e.g. openssl rand -hex 32)")
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise AccessRefused(f"the token file {path} holds more than one printable word: write one token into it")
    return token


def _host_name(entry: str) -> str:
    """An allowed host as the Host header spells it (lower case); AccessRefused for one it cannot be."""
    name = entry.strip().lower()
    if not name or "/" in name or "@" in name or any(c.isspace() for c in name) or not name.isascii():
        raise AccessRefused(
            f"allowed host {entry!r} is not a host name: give NAME or NAME:PORT (e.g. gateway.internal:8765)"
        )
    return name


@dataclass(frozen=True)
class Access:
    """Who may call: Host names added to the loopback names (`allowed_hosts`), the address the
    gateway was bound to (`bound`), and the bearer `token` callers must send (None: none)."""

    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None
    bound: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_hosts", tuple(_host_name(h) for h in self.allowed_hosts))

    def host_allowed(self, host: str, port: int | None) -> bool:
        """Whether a request whose Host header is `host`, come in on `port` (None: not known), names
        this gateway."""
        name, named_port = _split(host.lower())
        bound = [_bracketed(self.bound.lower())] if self.bound and self.bound not in _WILDCARDS else []
        own = [*LOOPBACK_NAMES, *bound]
        if name in own and (port is None or named_port == str(port) or named_port is None and port == 80):
            return True
        for entry in self.allowed_hosts:
            entry_name, entry_port = _split(entry)
            if name == entry_name and (entry_port is None or entry_port == named_port):
                return True
        return False

    def origin_allowed(self, origin: str, port: int | None) -> bool:
        """Whether browser Origin `origin` is this gateway's own (http or https, an allowed Host)."""
        scheme, _, host = origin.partition("://")
        return scheme.lower() in ("http", "https") and "/" not in host and self.host_allowed(host, port)

    def refusal(self, scope: Scope) -> JSONResponse | None:
        """The answer refusing request `scope`, or None when it may be served."""
        if scope["type"] not in ("http", "websocket") or scope["path"] in _OPEN_PATHS:
            return None
        server = scope.get("server")
        if not (server and server[1] is None):  # not a Unix socket (see the module's docstring)
            refused = self._naming_refusal(scope, server[1] if server else None)
            if refused is not None:
                return refused
        if self.token is None:
            return None
        scheme, _, presented = (hotpath.header(scope, _AUTHORIZATION) or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), self.token.encode()):
            return None
        challenge = 'Bearer realm="worldsmith"' + (', error="invalid_token"' if presented else "")
        response = _refused(401, "this gateway needs a bearer token: send Authorization: Bearer <token>")
        response.headers["www-authenticate"] = challenge
        return response

    def _naming_refusal(self, scope: Scope, port: int | None) -> JSONResponse | None:
        """The 403 refusing a request whose Host or Origin does not name this gateway, or None."""
        host = hotpath.header(scope, _HOST)
        if host is None or not self.host_allowed(host, port):
            return _refused(
                403,
                f"Host {(host or '')[:100]!r} is not a name of this gateway (localhost, 127.0.0.1, [::1] and its "
                "address on its port): name it with env serve --allow-host or WORLDSMITH_GATEWAY_ALLOWED_HOSTS",
            )
        origin = hotpath.header(scope, _ORIGIN)
        if origin is not None and not self.origin_allowed(origin, port):
            return _refused(403, f"Origin {origin[:100]!r} is not this gateway's: pages of other sites cannot call it")
        return None

    def guard(self, app: ASGIApp) -> ASGIApp:
        """`app` behind these checks."""

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            refused = self.refusal(scope)
            if refused is None:
                await app(scope, receive, send)
            elif scope["type"] == "websocket":
                await receive()  # the handshake's websocket.connect; closing it now refuses it (HTTP 403)
                await send({"type": "websocket.close", "code": 1008, "reason": bytes(refused.body).decode()[:120]})
            else:
                await refused(scope, receive, send)

        return guarded


def _split(host: str) -> tuple[str, str | None]:
    """The name and the port (None: none) of a Host header: `[::1]:8765` is `[::1]` and `8765`."""
    if host.startswith("["):
        name, _, rest = host.partition("]")
        return name + "]", rest[1:] if rest.startswith(":") else None
    name, colon, port = host.partition(":")
    return name, port if colon else None


def _bracketed(address: str) -> str:
    """An address as a Host header names it (an IPv6 address in brackets)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def _refused(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
