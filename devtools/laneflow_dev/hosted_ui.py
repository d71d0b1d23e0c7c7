"""A local imitation of a Cognito user pool's hosted UI, for the viewer's sign-in tests: the
authorization code grant with PKCE as Cognito answers it, on 127.0.0.1 (plain http).

- `GET /oauth2/authorize`: checks the request as Cognito does (response_type=code, the app
  client, a registered callback URL, the openid scope, an S256 code_challenge) and shows a
  sign-in page; its button (`POST /login`) redirects to the callback with a code and the
  request's state (or `forged_state`, to try the viewer's check).
- `POST /oauth2/token`: a form-encoded authorization_code grant; the code is good once, for
  its client and redirect_uri, and only with the verifier whose S256 challenge it was issued
  for. Answers an ID token (JWT-shaped; its signature is not a real one), with
  `Access-Control-Allow-Origin: *` as Cognito's token endpoint has.
- `GET /logout`: client_id and a registered logout_uri; redirects there.

Every request is kept (`authorizations`, `exchanges`, `logouts`) for the tests to look at."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit


def base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def s256(verifier: str) -> str:
    """The S256 code challenge of a verifier (RFC 7636 section 4.2)."""
    return base64url(hashlib.sha256(verifier.encode("ascii")).digest())


@dataclass
class Grant:
    """A code issued, and what redeeming it takes."""

    client_id: str
    redirect_uri: str
    challenge: str
    username: str


@dataclass
class HostedUi:
    """The imitation's configuration and what it was asked. `callbacks` and `logout_urls` are
    the app client's registered URLs (set them once the viewer's URL is known)."""

    client_id: str
    callbacks: list[str] = field(default_factory=list)
    logout_urls: list[str] = field(default_factory=list)
    username: str = "alice@example.com"
    tenant: str = "harbour"
    token_ttl_s: int = 3600
    forged_state: str | None = None  # the state the next answers carry instead of the request's
    authorizations: list[dict[str, str]] = field(default_factory=list)
    exchanges: list[dict[str, str]] = field(default_factory=list)
    logouts: list[dict[str, str]] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)  # the ID tokens, in order
    _pending: dict[str, dict[str, str]] = field(default_factory=dict)
    _grants: dict[str, Grant] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the hosted UI is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> HostedUi:
        hosted = self

        class Handler(_Handler):
            ui = hosted

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- the endpoints ----------------------------------------------------------------------

    def authorize(self, query: dict[str, str]) -> tuple[int, dict[str, str], str]:
        self.authorizations.append(query)
        problem = self._authorize_problem(query)
        if problem:
            return 400, {}, _page("Sign-in error", f"<p>{html.escape(problem)}</p>")
        request = secrets.token_urlsafe(12)
        with self._lock:
            self._pending[request] = query
        form = (
            f'<form method="post" action="/login"><input type="hidden" name="request" value="{request}">'
            f'<label>Username <input name="username" value="{html.escape(self.username)}"></label>'
            '<label>Password <input name="password" type="password" value="imitation"></label>'
            '<button type="submit">Sign in</button></form>'
        )
        return 200, {}, _page("Sign in", form)

    def _authorize_problem(self, query: dict[str, str]) -> str | None:
        if query.get("response_type") != "code":
            return "response_type must be code (this client has the code grant only)"
        if query.get("client_id") != self.client_id:
            return "no such app client"
        if query.get("redirect_uri") not in self.callbacks:
            return "redirect_mismatch: the redirect_uri is not one of the client's callback URLs"
        if "openid" not in query.get("scope", "").split():
            return "the scope has no openid"
        if query.get("code_challenge_method") != "S256" or len(query.get("code_challenge", "")) != 43:
            return "a public client's request carries an S256 code_challenge"
        return None

    def login(self, form: dict[str, str]) -> tuple[int, dict[str, str], str]:
        with self._lock:
            query = self._pending.pop(form.get("request", ""), None)
        if query is None:
            return 400, {}, _page("Sign-in error", "<p>this sign-in has expired; start again</p>")
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._grants[code] = Grant(
                query["client_id"], query["redirect_uri"], query["code_challenge"], form.get("username") or ""
            )
        state = self.forged_state if self.forged_state is not None else query.get("state", "")
        return 302, {"Location": query["redirect_uri"] + "?" + urlencode({"code": code, "state": state})}, ""

    def token(self, form: dict[str, str], content_type: str) -> tuple[int, dict[str, str], str]:
        self.exchanges.append(form)
        cors = {"Access-Control-Allow-Origin": "*", "Content-Type": "application/json"}
        if content_type.split(";")[0].strip() != "application/x-www-form-urlencoded":
            return 400, cors, json.dumps({"error": "invalid_request"})
        if form.get("grant_type") != "authorization_code":
            return 400, cors, json.dumps({"error": "unsupported_grant_type"})
        with self._lock:
            grant = self._grants.pop(form.get("code", ""), None)  # good once, whatever follows
        if grant is None or grant.client_id != form.get("client_id") or grant.redirect_uri != form.get("redirect_uri"):
            return 400, cors, json.dumps({"error": "invalid_grant"})
        if s256(form.get("code_verifier", "")) != grant.challenge:
            return (
                400,
                cors,
                json.dumps({"error": "invalid_grant", "error_description": "the code_verifier is not the challenge's"}),
            )
        id_token = self._id_token(grant)
        self.issued.append(id_token)
        answer = {
            "id_token": id_token,
            "access_token": "imitation-access-" + secrets.token_urlsafe(8),
            "refresh_token": "imitation-refresh-" + secrets.token_urlsafe(8),
            "expires_in": self.token_ttl_s,
            "token_type": "Bearer",
        }
        return 200, cors, json.dumps(answer)

    def _id_token(self, grant: Grant) -> str:
        now = int(time.time())
        claims = {
            "sub": "imitation-" + hashlib.sha256(grant.username.encode()).hexdigest()[:12],
            "email": grant.username,
            "cognito:username": grant.username,
            "custom:tenant": self.tenant,
            "aud": grant.client_id,
            "iss": self.url,
            "token_use": "id",
            "auth_time": now,
            "iat": now,
            "exp": now + self.token_ttl_s,
            "jti": secrets.token_hex(8),
        }
        head = base64url(json.dumps({"alg": "RS256", "kid": "imitation"}).encode())
        return f"{head}.{base64url(json.dumps(claims).encode())}.{base64url(b'not-a-real-signature')}"

    def logout(self, query: dict[str, str]) -> tuple[int, dict[str, str], str]:
        self.logouts.append(query)
        if query.get("client_id") != self.client_id or query.get("logout_uri") not in self.logout_urls:
            return 400, {}, _page("Sign-out error", "<p>the logout_uri is not one of the client's sign-out URLs</p>")
        return 302, {"Location": query["logout_uri"]}, ""


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)} · hosted UI (imitation)</title>"
        "<style>body{font:15px system-ui,sans-serif;background:#f2f3f3;display:grid;place-items:center;height:90vh}"
        "main{background:#fff;padding:2em 2.4em;border-radius:8px;box-shadow:0 1px 4px #0002;min-width:22em}"
        "label{display:block;margin:.6em 0}input{display:block;width:100%;padding:.4em;margin-top:.2em}"
        "button{margin-top:1em;width:100%;padding:.55em;background:#0972d3;color:#fff;border:0;border-radius:4px}</style>"
        f"</head><body><main><h1>{html.escape(title)}</h1>{body}</main></body></html>"
    )


class _Handler(BaseHTTPRequestHandler):
    ui: HostedUi

    def do_GET(self) -> None:  # http.server names them so
        target = urlsplit(self.path)
        query = dict(parse_qsl(target.query, keep_blank_values=True))
        if target.path == "/oauth2/authorize":
            self._answer(*self.ui.authorize(query))
        elif target.path == "/logout":
            self._answer(*self.ui.logout(query))
        else:
            self._answer(404, {}, _page("Not found", ""))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        form = dict(parse_qsl(self.rfile.read(length).decode("utf-8", "replace"), keep_blank_values=True))
        path = urlsplit(self.path).path
        if path == "/oauth2/token":
            self._answer(*self.ui.token(form, self.headers.get("Content-Type", "")))
        elif path == "/login":
            self._answer(*self.ui.login(form))
        else:
            self._answer(404, {}, "")

    def _answer(self, status: int, headers: dict[str, str], text: str) -> None:
        data = text.encode()
        self.send_response(status)
        headers = {"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-store", **headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None
