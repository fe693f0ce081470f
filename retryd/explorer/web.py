"""What every explorer page needs: the explorer's state (sessions, templates, static files),
rendering with the security headers, the session of a request, and the headers middleware."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from retryd.api.asgi import ASGIApp, Message, Receive, Scope, Send
from retryd.api.credentials import Credentials
from retryd.api.state import Sidecar
from retryd.config import Settings
from retryd.explorer.security import COOKIE, SECURITY_HEADERS, LoginForms, is_ui
from retryd.explorer.sessions import (
    LoginThrottle,
    Lookup,
    Session,
    SessionStore,
    per_token_share,
)
from retryd.replay.replayer import ReplayOutcome

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
STATIC_TYPES = {
    "explorer.js": "text/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
}
MAX_SINGLES = 1000  # single replays remembered for their result page
# Pages answer HEAD as well (link checkers, uptime probes): the same answer without its body.
PAGE_METHODS = ["GET", "HEAD"]


@dataclass
class Single:
    """A one-record replay made from the explorer, shown on its job page."""

    outcome: ReplayOutcome
    actor: str
    at: float


class Explorer:
    """Everything the explorer's pages share in one sidecar process, built once."""

    def __init__(self, settings: Settings, sidecar: Sidecar, credentials: Credentials) -> None:
        self.settings = settings
        self.sidecar = sidecar
        self.credentials = credentials
        # Each token gets an equal share of explorer_max_sessions: signing in again and again
        # with one token replaces its own sessions and never ends another token's.
        tokens = len(credentials.tokens)
        self.sessions = SessionStore(
            idle_s=settings.explorer_session_idle_s,
            max_s=settings.explorer_session_max_s,
            max_sessions=settings.explorer_max_sessions,
            max_per_token=per_token_share(settings.explorer_max_sessions, tokens),
        )
        if tokens > settings.explorer_max_sessions:
            log.warning(
                "%d API tokens but explorer_max_sessions is %d: each token may hold one "
                "explorer session, and sign-ins are refused while all are in use",
                tokens,
                settings.explorer_max_sessions,
            )
        self.throttle = LoginThrottle()
        self.login_forms = LoginForms()
        self.secure = settings.sidecar_tls_cert_file is not None
        self.scheme = "https" if self.secure else "http"
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=False,
        )
        self.static = {name: (HERE / "static" / name).read_bytes() for name in STATIC_TYPES}
        self.singles: OrderedDict[str, Single] = OrderedDict()

    def remember(self, single: Single) -> str:
        job_id = f"one-{single.outcome.replay_id}"
        self.singles[job_id] = single
        while len(self.singles) > MAX_SINGLES:
            self.singles.popitem(last=False)
        return job_id

    def render(
        self,
        request: Request,
        template: str,
        status: int = 200,
        session: Session | None = None,
        **context: Any,
    ) -> HTMLResponse:
        html = self.templates.get_template(template).render(
            group=self.settings.group_id, session=session, request=request, **context
        )
        return HTMLResponse(html, status_code=status)

    def message(
        self,
        request: Request,
        status: int,
        heading: str,
        text: str,
        *,
        session: Session | None = None,
        section_id: str = "error",
        problems: list[str] | None = None,
        back: str | None = None,
    ) -> HTMLResponse:
        return self.render(
            request,
            "message.html",
            status,
            session,
            heading=heading,
            message=text,
            section_id=section_id,
            problems=problems or [],
            back=back,
        )


def explorer_of(request: Request) -> Explorer:
    found: Explorer = request.app.state.explorer
    return found


def login_redirect(request: Request, *, expired: bool) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if request.method != "GET":
        target = "/ui/"
    url = f"/ui/login?next={quote(target, safe='/')}" + ("&expired=1" if expired else "")
    return RedirectResponse(url, status_code=303)


def session_of(request: Request) -> tuple[Session | None, Response | None]:
    """The request's live session, or the redirect to the sign-in page to answer instead."""
    ex = explorer_of(request)
    session, why = ex.sessions.get(request.cookies.get(COOKIE))
    if session is None:
        return None, login_redirect(request, expired=why is Lookup.EXPIRED)
    return session, None


class SignInFirst(Exception):
    """No live session: the route does not run, and ``answer`` (the redirect to the sign-in
    page) is the response (``install`` registers the handler)."""

    def __init__(self, answer: Response) -> None:
        super().__init__("sign in first")
        self.answer = answer


def signed_in(request: Request) -> Session:
    """The dependency of every page: the request's live session (see ``SignInFirst``)."""
    session, answer = session_of(request)
    if session is None:
        assert answer is not None
        raise SignInFirst(answer)
    return session


async def answer_sign_in_first(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SignInFirst)
    return exc.answer


SignedIn = Annotated[Session, Depends(signed_in)]


class UiHeadersMiddleware:
    """Adds the explorer's security headers to every answer under /ui, whoever made it
    (pages, redirects, the API's JSON errors, 404s, a bulkhead's 503)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in SECURITY_HEADERS.items()
        ]
        self.names = {name for name, _ in self.headers}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or not is_ui(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() not in self.names
                ]
                message = {**message, "headers": [*kept, *self.headers]}
            await send(message)

        await self.app(scope, receive, with_headers)
