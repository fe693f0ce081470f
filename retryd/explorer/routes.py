"""The explorer's pages under ``/ui``: sign-in and out, browsing and one record.

Acting (dry runs, replays, jobs) is in ``retryd.explorer.acting``; the overview in
``retryd.explorer.overview_page``. Every page needs a session (``web.SignedIn``), every POST
its CSRF token and a same-origin browser (``check_post``; a sign-in needs the sign-in form's
own token, ``security.LoginForms``), and broker work runs on the API's bulkhead threads
through the API's own functions (``offload``, ``browse``, ``read_record``).
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import time
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import RedirectResponse, Response

from retryd.api.errors import status_of
from retryd.api.limits import offload
from retryd.explorer import preview as pv
from retryd.explorer.filters import FilterProblem, UiFilter
from retryd.explorer.newest import NewestPage, browse_newest
from retryd.explorer.security import (
    COOKIE,
    COOKIE_PATH,
    LOGIN_COOKIE,
    LOGIN_COOKIE_PATH,
    client_address,
    safe_next,
    same_origin,
)
from retryd.explorer.sessions import Session, SessionsFull, csrf_ok
from retryd.explorer.web import (
    PAGE_METHODS,
    STATIC_TYPES,
    Explorer,
    SignedIn,
    explorer_of,
    session_of,
)
from retryd.metrics.http import count_auth_failure
from retryd.policy import headers as h
from retryd.policy.timespec import format_instant
from retryd.replay import audit
from retryd.replay.browse import read_record
from retryd.replay.errors import ReplayError
from retryd.replay.records import DEAD_REASONS
from retryd.replay.sources import dead_letter_topics, source_topic

log = logging.getLogger(__name__)

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
LIST_PREVIEW = 256
MAX_FORM_FIELDS = 1000
LOGIN_FAILED = "Sign-in failed: the token is not valid."
THROTTLED = (
    "Sign-in failed: the token is not valid, and too many sign-ins have failed lately; "
    "wait {wait} s before trying again."
)
CROSS_SITE = "Sign-in refused: the form was sent from another site."
STALE_FORM = (
    "Sign-in refused: the form was not sent by this page, or was open too long. "
    "Enter the token again."
)
SESSIONS_FULL = (
    "Sign-in refused: all {max} explorer sessions are in use (explorer_max_sessions). "
    "Try again in {wait} s, or ask someone to sign out."
)
DISABLED = "The explorer is disabled: no API token is configured."
EXPIRED = "Your session expired; sign in again."


async def read_form(request: Request) -> dict[str, list[str]]:
    """A urlencoded form body (already bounded by the body-size middleware)."""
    body = await request.body()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return {}
    return parse_qs(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)


def first(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


def check_post(
    request: Request, form: dict[str, list[str]], *, needs: str = "read"
) -> tuple[Session | None, Response | None]:
    """The session of a POST with a valid CSRF token from this origin and the scope
    ``needs``; else the answer to give (sign-in redirect, or a 403 page)."""
    ex = explorer_of(request)
    session, answer = session_of(request)
    if session is None:
        return None, answer
    if not same_origin(request.headers, ex.scheme) or not csrf_ok(session, first(form, "csrf")):
        return None, ex.message(
            request,
            403,
            "Request refused",
            "The form's security token is missing or stale, or the request came from another "
            "site. Reload the page and try again.",
            session=session,
            section_id="forbidden",
        )
    if not session.allows(needs):
        count_auth_failure("insufficient_scope")
        return None, ex.message(
            request,
            403,
            "Not allowed",
            f"Your token ({session.token_id}) has scope {session.scope}; this needs scope {needs}.",
            session=session,
            section_id="forbidden",
        )
    return session, None


def replay_error_page(
    request: Request, exc: ReplayError, session: Session | None, back: str = "/ui/"
) -> Response:
    """A replay-layer error as a page, with the status code and the error code the API gives
    it (``too_large``, ``nothing_to_replay``…)."""
    status, code = status_of(exc)
    if status >= 500:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
    return explorer_of(request).message(
        request,
        status,
        "Could not do that",
        str(exc)[:2000],
        session=session,
        problems=[f"Error code: {code}"],
        back=back,
    )


# ------------------------------------------------------------------ sign-in
#
# POST /ui/login checks, in this order: the browser's origin, the form's CSRF token, then the
# token itself (constant time, against every configured digest). Only then does the failure
# throttle come in, and only for a token that is not valid: a valid token signs in however
# many sign-ins failed before it, from its address or any other, so nobody's flood of wrong
# tokens locks a token holder out. Failures past the limits get 429 with Retry-After.


def login_form(
    request: Request,
    status: int,
    *,
    target: str,
    error: str | None = None,
    notice: str | None = None,
    retry_after: str | None = None,
) -> Response:
    """The sign-in page with a CSRF token bound to the browser's pre-session cookie (given
    or renewed here: ``security.LoginForms``)."""
    ex = explorer_of(request)
    had = request.cookies.get(LOGIN_COOKIE)
    cookie, form_token = ex.login_forms.issue(had)
    answer = ex.render(
        request,
        "login.html",
        status,
        next=target,
        notice=notice,
        error=error,
        enabled=ex.credentials.enabled,
        login_csrf=form_token,
    )
    if ex.credentials.enabled and cookie != had:
        answer.set_cookie(
            LOGIN_COOKIE,
            cookie,
            max_age=int(ex.login_forms.max_age_s),
            path=LOGIN_COOKIE_PATH,
            httponly=True,
            samesite="strict",
            secure=ex.secure,
        )
    if retry_after is not None:
        answer.headers["Retry-After"] = retry_after
    return answer


@router.api_route("/login", methods=PAGE_METHODS)
async def login_page(
    request: Request,
    next: Annotated[str | None, Query(max_length=2048)] = None,
    expired: Annotated[str | None, Query(max_length=8)] = None,
) -> Response:
    status = 200 if explorer_of(request).credentials.enabled else 503
    return login_form(request, status, target=safe_next(next), notice=EXPIRED if expired else None)


@router.post("/login")
async def login(request: Request) -> Response:
    ex = explorer_of(request)
    form = await read_form(request)
    target = safe_next(first(form, "next"))
    client = client_address(request.scope.get("client"))

    if not ex.credentials.enabled:
        return login_form(request, 503, target=target, error=DISABLED)
    if not same_origin(request.headers, ex.scheme):
        return login_form(request, 403, target=target, error=CROSS_SITE)
    if not ex.login_forms.check(request.cookies.get(LOGIN_COOKIE), first(form, "csrf")):
        return login_form(request, 403, target=target, error=STALE_FORM)
    given = (first(form, "token") or "").strip()
    token = ex.credentials.identify(given.encode("utf-8")) if 0 < len(given) <= 1024 else None
    if token is None:
        reason = "missing_token" if not given else "invalid_token"
        count_auth_failure(reason)
        failure = ex.throttle.failed(client)
        if failure.audit:
            fields = {"peer": client, "reason": reason}
            if failure.wait_s > 0:
                fields["limit"] = failure.limit
            audit.audit_log.info(
                "%s %s",
                "ui_sign_in_throttled" if failure.wait_s > 0 else "ui_sign_in_failed",
                audit.audit_fields(fields),
            )
        if failure.wait_s > 0:
            text = THROTTLED.format(wait=failure.retry_after)
            return login_form(
                request, 429, target=target, error=text, retry_after=failure.retry_after
            )
        return login_form(request, 401, target=target, error=LOGIN_FAILED)
    ex.sessions.end(request.cookies.get(COOKIE))  # this browser's previous session, if any
    try:
        session_id, _ = ex.sessions.create(token.id, token.scope)
    except SessionsFull as full:
        audit.audit_log.info(
            "ui_sign_in_refused %s",
            audit.audit_fields({"actor": token.id, "reason": "sessions_full"}),
        )
        wait = str(max(1, math.ceil(full.retry_after_s)))
        text = SESSIONS_FULL.format(max=ex.sessions.max_sessions, wait=wait)
        return login_form(request, 503, target=target, error=text, retry_after=wait)
    audit.audit_log.info(
        "ui_sign_in %s", audit.audit_fields({"actor": token.id, "scope": token.scope})
    )
    answer = RedirectResponse(target, status_code=303)
    answer.set_cookie(
        COOKIE,
        session_id,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=ex.secure,
    )
    answer.delete_cookie(
        LOGIN_COOKIE, path=LOGIN_COOKIE_PATH, httponly=True, samesite="strict", secure=ex.secure
    )
    return answer


@router.post("/logout")
async def logout(request: Request) -> Response:
    ex = explorer_of(request)
    form = await read_form(request)
    session, answer = check_post(request, form)
    if session is None:
        assert answer is not None
        return answer
    ex.sessions.end(request.cookies.get(COOKIE))
    audit.audit_log.info("ui_sign_out %s", audit.audit_fields({"actor": session.token_id}))
    out = RedirectResponse("/ui/login", status_code=303)
    out.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict", secure=ex.secure)
    return out


@router.api_route("/static/{name}", methods=PAGE_METHODS)
async def static(request: Request, name: Annotated[str, Path(max_length=64)]) -> Response:
    """The explorer's own script and stylesheet, read once at start-up (nothing else)."""
    body = explorer_of(request).static.get(name)
    if body is None:
        return Response("not found", status_code=404, media_type="text/plain")
    return Response(body, media_type=STATIC_TYPES[name])


# ------------------------------------------------------------------ browse


def _binary_key(data: str) -> str:
    """A key that is not UTF-8, as hex like on the record page (the API gives it in base64)."""
    try:
        raw = base64.b64decode(data[:160], validate=True)  # 120 bytes: more than a cell shows
    except (binascii.Error, ValueError):
        return "(unreadable key)"
    return pv.hex_cell(raw, 120, more=len(data) > 160)


def record_row(item: dict[str, Any], topic: str) -> dict[str, Any]:
    """A dead letter (as the API renders it) as a table row of the list or a dry run's
    sample: cut, neutralised text, the key as the record page shows it."""
    env = item["retryd"]
    key = item["key"]
    key_text = (
        "(null)"
        if key["encoding"] is None
        else pv.short(key["data"], 120)
        if key["encoding"] == "utf-8"
        else _binary_key(key["data"])
    )
    msg = env.get(h.ERROR_MESSAGE)
    cls = env.get(h.ERROR_CLASS)
    src = env.get(h.ORIGINAL_TOPIC)
    return {
        "partition": item["partition"],
        "offset": item["offset"],
        "time": format_instant(item["timestamp"]),
        "href": f"/ui/dead-letters/{item['partition']}/{item['offset']}?"
        + urlencode({"topic": topic}),
        "key": key_text,
        "reason": pv.short(
            env.get(h.DEAD_REASON) if isinstance(env.get(h.DEAD_REASON), str) else ""
        ),
        "error_class": pv.short(cls if isinstance(cls, str) else "", 120),
        "error_message": pv.short(msg if isinstance(msg, str) else "", 160),
        "source": pv.short(src if isinstance(src, str) else "", 120),
        "retry": env.get(h.RETRY_NUMBER) if isinstance(env.get(h.RETRY_NUMBER), int) else "",
    }


@router.api_route("/dead-letters", methods=PAGE_METHODS)
async def browse_page(
    request: Request,
    session: SignedIn,
    cursor: Annotated[str | None, Query(max_length=65_536)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = PAGE_SIZE,
) -> Response:
    ex = explorer_of(request)
    sc = ex.sidecar
    topics = dead_letter_topics(ex.settings)
    context: dict[str, Any] = {
        "active": "browse",
        "topics": topics,
        "reasons": DEAD_REASONS,
        "can_act": session.allows("replay"),
        "page": None,
        "error": None,
        "cursor": cursor,
    }
    try:
        uf = UiFilter.read(_multi(request))
        topic = source_topic(ex.settings, uf.topic)
        flt = uf.to_filter(int(time.time() * 1000))
    except (FilterProblem, ReplayError) as exc:
        return ex.render(
            request,
            "browse.html",
            400,
            session,
            f=UiFilter(),
            filter_fields=[],
            rows=[],
            **{**context, "error": str(exc)[:500]},
        )
    uf = UiFilter(**{**uf.__dict__, "topic": topic})

    def work() -> tuple[NewestPage, set[str]]:
        page = browse_newest(
            sc.pool,
            flt,
            cursor=cursor,
            limit=limit,
            preview_bytes=LIST_PREVIEW,
            timeout_s=sc.timeout_s,
            topic=topic,
        )
        ledger = sc.ready_ledger()
        replayed = {i["coordinate"] for i in page.items if ledger.get(i["coordinate"])}
        return page, replayed

    sized = {"limit": str(limit)} if limit != PAGE_SIZE else {}
    try:
        page, replayed = await offload(request, work)
    except ReplayError as exc:
        status, _ = status_of(exc)
        return ex.render(
            request,
            "browse.html",
            status,
            session,
            f=uf,
            filter_fields=uf.items(),
            rows=[],
            **{**context, "error": str(exc)[:500]},
        )
    return ex.render(
        request,
        "browse.html",
        200,
        session,
        f=uf,
        filter_fields=uf.items(),
        rows=[
            {**record_row(item, topic), "replayed": item["coordinate"] in replayed}
            for item in page.items
        ],
        next_href="/ui/dead-letters?" + uf.query(**sized, cursor=page.next_cursor),
        first_href="/ui/dead-letters?" + uf.query(**sized),
        **{**context, "page": page},
    )


def _multi(request: Request) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        out.setdefault(name, []).append(value)
    return out


# ------------------------------------------------------------------ one record


def curl_for(ex: Explorer, request: Request, topic: str, partition: int, offset: int) -> str:
    """The API call that replays this record, with a placeholder for the token."""
    base = f"{request.url.scheme}://{request.url.netloc}"
    query = "" if topic == ex.settings.failed_topic else "?" + urlencode({"topic": topic})
    url = f"{base}/v1/failed/{partition}/{offset}/replay{query}"
    return (
        'curl -sS -X POST -H "Authorization: Bearer $RETRYD_TOKEN" '
        f"'{url.replace(chr(39), '%27')}'"
    )


@router.api_route("/dead-letters/{partition}/{offset}", methods=PAGE_METHODS)
async def record_page(
    request: Request,
    session: SignedIn,
    partition: Annotated[int, Path(ge=0, le=2**31 - 1)],
    offset: Annotated[int, Path(ge=0, le=2**63 - 1)],
    topic: Annotated[str | None, Query(max_length=249)] = None,
) -> Response:
    ex = explorer_of(request)
    sc = ex.sidecar
    back = "/ui/dead-letters?" + urlencode({"topic": topic} if topic else {})
    try:
        source = source_topic(ex.settings, topic)
        rec = await offload(request, read_record, sc.pool, partition, offset, sc.timeout_s, source)
        ledger = await offload(request, sc.ready_ledger)
        entry = ledger.get(rec.coord)
    except ReplayError as exc:
        return replay_error_page(request, exc, session, back)
    replayed = None
    if entry is not None:
        replayed = (
            f"to {entry.target_topic}/{entry.target_partition}/{entry.target_offset} "
            f"by {entry.by} ({entry.replay_id})"
        )
    env = rec.envelope
    return ex.render(
        request,
        "record.html",
        200,
        session,
        active="browse",
        rec={
            "topic": rec.topic,
            "partition": rec.partition,
            "offset": rec.offset,
            "time": format_instant(rec.timestamp),
        },
        back=back,
        replayed=replayed,
        can_act=session.allows("replay"),
        decoded=pv.decoded(env),
        key=pv.preview(rec.key, pv.HEADER_MAX),
        headers=pv.header_rows(rec.headers),
        headers_error=rec.headers_error,
        mapping_problems=[pv.short(p, 300) for p in rec.mapping_problems],
        payload=pv.preview(rec.value, pv.PAYLOAD_MAX),
        payload_max=pv.PAYLOAD_MAX,
        curl=curl_for(ex, request, rec.topic, rec.partition, rec.offset),
    )
