"""The dead-letter explorer: server-rendered pages under ``/ui`` of the sidecar (sign-in with
an API token, overview, browse, one record, dry run, replay, job progress)."""

from __future__ import annotations

from fastapi import FastAPI

from retryd.api.credentials import Credentials
from retryd.api.state import Sidecar
from retryd.config import Settings


def install(app: FastAPI, settings: Settings, sidecar: Sidecar, credentials: Credentials) -> None:
    """Add the explorer's routes and state to the sidecar's app (its headers middleware is
    ``retryd.explorer.web.UiHeadersMiddleware``, added by ``create_app``)."""
    from retryd.explorer.acting import router as acting_router
    from retryd.explorer.overview_page import router as overview_router
    from retryd.explorer.routes import router as pages_router
    from retryd.explorer.web import Explorer, SignInFirst, answer_sign_in_first

    app.state.explorer = Explorer(settings, sidecar, credentials)
    app.add_exception_handler(SignInFirst, answer_sign_in_first)
    app.include_router(overview_router)
    app.include_router(pages_router)
    app.include_router(acting_router)
