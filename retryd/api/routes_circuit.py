"""``/v1/circuit``: see and steer the group's outage circuit breaker (``retryd.api.circuit``).

``GET`` needs the ``read`` scope, ``POST`` the ``circuit`` scope (``retryd.api.auth``), which
``replay`` does not include: replaying records and stopping a whole group are different
powers. Both read or write small files in the state dir on a thread of the ``circuit``
bulkhead (``retryd.api.limits``), never on the event loop.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Security

from retryd.api.auth import actor_of, bearer_scheme
from retryd.api.circuit import circuit_view, give_order
from retryd.api.limits import offload
from retryd.api.routes_v1 import COMMON, err_doc
from retryd.api.schemas import CircuitOrderIn, CircuitOrderOut, CircuitOut
from retryd.config import Settings
from retryd.policy.circuit import CircuitAction

router = APIRouter(
    prefix="/v1",
    tags=["circuit breaker"],
    dependencies=[Security(bearer_scheme)],
    responses=COMMON,
)


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.sidecar.settings
    return settings


@router.get(
    "/circuit",
    response_model=CircuitOut,
    summary="The circuit breaker of every live worker process of this sidecar's group",
    description="From the workers' heartbeats in the shared state dir: each process's state, "
    "the worst of them, the last error, and the last order given.",
)
async def get_circuit(request: Request) -> CircuitOut:
    return await offload(request, circuit_view, _settings(request))


@router.post(
    "/circuit",
    response_model=CircuitOrderOut,
    status_code=202,
    summary="Order every worker process of this group to open, close or probe its circuit",
    description="Needs a token with the `circuit` scope. Accepted, not yet applied: each "
    "worker process of this pod applies the order once, at its next heartbeat. An open "
    "circuit stays open until a probe's call is answered or an operator closes it.",
    responses={
        403: err_doc("the token lacks the circuit scope"),
        503: err_doc("the order could not be written to the state dir, or /v1 is disabled"),
    },
)
async def post_circuit(request: Request, body: CircuitOrderIn) -> CircuitOrderOut:
    action = CircuitAction(body.action)
    return await offload(request, give_order, _settings(request), action, actor_of(request))
