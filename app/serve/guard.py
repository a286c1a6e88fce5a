"""The ASGI middleware that puts `Access` (access.py) in front of every request, outermost, so
the page, Gradio's own routes and the API are checked alike.

In order: the Host (403), the Origin (403), a CORS preflight from an allowed origin (answered
here: browsers send it without the key), then the key (401). A refused request is answered
with an OpenAI-style JSON error before its body is read; a refused websocket is closed.
Answers to an allowed cross-origin request carry the CORS headers that let its page read them.
"""
from __future__ import annotations

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.serve.access import Access
from app.serve.errors import APIError

# WebSocket close code for a connection refused by policy (RFC 6455).
POLICY_VIOLATION = 1008
PREFLIGHT_MAX_AGE_S = 600
ALLOWED_METHODS = "GET, POST, OPTIONS"


class Guard:
    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        try:
            self.access.check_host(headers.get("host"))
            cross_origin = self.access.check_origin(origin, headers.get("host", ""))
            if (cross_origin and scope["type"] == "http" and scope["method"] == "OPTIONS"
                    and "access-control-request-method" in headers):
                await preflight(origin, headers)(scope, receive, send)
                return
            self.access.check_key(scope["path"], headers.get("authorization"))
        except APIError as error:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": POLICY_VIOLATION})
                return
            response = JSONResponse(error.body(), status_code=error.status, headers=error.headers)
            await response(scope, receive, send)
            return
        if cross_origin:
            send = with_cors(send, origin)
        await self.app(scope, receive, send)


def preflight(origin: str, headers: Headers) -> Response:
    """The answer to an allowed origin's preflight: its method and the headers it asked for
    (an origin the user listed is trusted; its clients send their own headers)."""
    allow = {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
             "Access-Control-Allow-Methods": ALLOWED_METHODS,
             "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S)}
    requested = headers.get("access-control-request-headers")
    if requested:
        allow["Access-Control-Allow-Headers"] = requested
    return Response(status_code=204, headers=allow)


def with_cors(send: Send, origin: str) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            out = MutableHeaders(scope=message)
            out["Access-Control-Allow-Origin"] = origin
            # Retry-After says when a full queue takes requests again.
            out["Access-Control-Expose-Headers"] = "Retry-After"
            out.add_vary_header("Origin")
        await send(message)
    return sending
