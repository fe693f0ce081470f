"""Error routes: parsing and validation, which route a failure takes, how a tier record
continues on its route, and the tiers a plan with routes derives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.config import load_settings
from retryd.errors import ConfigError, NonRetryableError
from retryd.policy import headers as h
from retryd.policy.classify import Classifier, HandlerResult, Outcome, classify_http
from retryd.policy.error_routes import (
    MAX_NAME,
    MAX_ROUTES,
    ErrorRouteError,
    Target,
    error_name,
    parse_error_routes,
    routes_from_value,
)
from retryd.policy.routing import Route, RoutePlanner
from retryd.policy.sequence import RetryPlan


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RETRYD_"):
            monkeypatch.delenv(name)


class Transient(Exception):
    pass


class Throttled(Transient):
    pass


class Declined(Exception):
    pass


class Poison(NonRetryableError):
    pass


class Listed(Transient):
    """A Transient (routed to a sequence) that is also listed as non_retryable."""


ROUTES = {
    "Transient": "1s,2s",
    f"{__name__}.Throttled": "exp(10s, x2, n=3, jitter=20%)",  # dotted: a subclass of Transient
    "Declined": "dlt:orders.declined",
    "KeyError": "dead",
    "Poison": "dlt:orders.poison",
    "timeout": "2s,2s,2s",
    "http_503": "5m",
    "http_5xx": "1s,5m,5m",
    "Locked": "30s,30s",
}
PLAN = RetryPlan.parse("5m,30m", failed_topic="failed", group="g", routes=ROUTES)
CLASSIFY = Classifier(["ValueError"])


def planner() -> RoutePlanner:
    return RoutePlanner(PLAN, "g", draw=lambda: 0.5)  # jitter draw 0.5: exactly the delay


def first(result: HandlerResult, now_ms: int = 1_000) -> Route:
    return planner().route("orders", 3, 41, 500, 0, None, [("u", b"1")], result, now_ms)


def again(route: Route, result: HandlerResult, now_ms: int = 2_000) -> Route:
    """The tier record ``route`` produced fails with ``result``: decoded as a worker does."""
    env = h.decode_tier_envelope(route.headers)
    return planner().failure(env, route.headers, result, now_ms)


def where(route: Route) -> tuple[str, int, str | None, bytes | None]:
    return (
        route.topic,
        route.retry_number,
        route.dead_reason,
        h.header_value(route.headers, h.ROUTE),
    )


# --- parsing ------------------------------------------------------------------------------------


def test_every_target_form_parses() -> None:
    routes = {r.name: r for r in PLAN.routes}
    assert routes["Transient"].target is Target.SEQUENCE
    assert routes["Transient"].delays_ms == (1_000, 2_000)
    assert routes[f"{__name__}.Throttled"].delays_ms == (10_000, 20_000, 40_000)
    assert routes[f"{__name__}.Throttled"].jitter == pytest.approx(0.2)
    assert (routes["Declined"].target, routes["Declined"].topic) == (Target.DLT, "orders.declined")
    assert routes["KeyError"].target is Target.DEAD and routes["KeyError"].terminal


def test_settings_take_a_toml_table_a_json_object_or_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "retryd.toml"
    path.write_text(
        'main_topics = ["orders"]\n'
        "[error_routes]\n"
        '"TimeoutError" = "exp(1s, n=3)"\n'
        '"http_5xx" = ["1m", "5m"]\n'
        '"myapp.Declined" = "dlt:orders.declined"\n'
    )
    from_toml = load_settings(path).error_routes
    assert from_toml == {
        "TimeoutError": "exp(1s, n=3)",
        "http_5xx": "1m,5m",
        "myapp.Declined": "dlt:orders.declined",
    }
    monkeypatch.setenv("RETRYD_ERROR_ROUTES", json.dumps(from_toml))
    assert load_settings(main_topics="orders").error_routes == from_toml
    monkeypatch.setenv(
        "RETRYD_ERROR_ROUTES",
        " TimeoutError = exp(1s, n=3) ; http_5xx=1m,5m; myapp.Declined=dlt:orders.declined;",
    )
    s = load_settings(main_topics="orders")
    assert s.error_routes == {**from_toml, "http_5xx": "1m,5m"}
    assert s.plan.dlt_topics == ["orders.declined"]


def test_env_form_problems_name_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, why in (
        ("{not json", "not a JSON object"),
        ("TimeoutError", "expected matcher=target"),
        ("A=1m; A=2m", "given twice"),
        ('{"A": 5}', "must be a string"),
        ("[1]", "expected matcher=target"),
    ):
        monkeypatch.setenv("RETRYD_ERROR_ROUTES", value)
        with pytest.raises(ConfigError) as err:
            load_settings(main_topics="orders")
        assert any(p.startswith("error_routes") and why in p for p in err.value.problems), (
            value,
            err.value.problems,
        )


@pytest.mark.parametrize(
    ("matcher", "target", "why"),
    [
        ("", "1m", "an empty matcher"),
        ("bad name", "1m", "not a matcher"),
        ("a..b", "1m", "not a matcher"),
        ("HTTP_503", "1m", "http_<status>"),
        ("http_5XX", "1m", "http_<status>"),
        ("http_200", "dead", "2xx answer is a success"),
        ("http_2xx", "dead", "2xx answer is a success"),
        ("http_404", "1m,5m", "HTTP 404 is non-retryable"),
        ("E", "", "an empty target"),
        ("E", "dlt:", "names no topic"),
        ("E", "dlt:bad topic", "invalid dead-letter topic"),
        ("E", "dlq:x", "expected a retry sequence"),
        ("E", "deadd", "expected a retry sequence"),
        ("E", "1m, quick=2@100ms", "quick= is not allowed"),
        ("E", "exp(1s, n=99)", "n='99'"),
        ("E", "dlt:failed", "that is failed_topic"),
        ("E", "dlt:retry_5m", "is a tier topic"),
        ("x" * (MAX_NAME + 1), "1m", "longer than"),
    ],
)
def test_invalid_routes_are_refused_naming_the_route(matcher: str, target: str, why: str) -> None:
    with pytest.raises(ErrorRouteError) as err:
        RetryPlan.parse("5m", failed_topic="failed", routes={matcher: target})
    [problem] = err.value.problems
    assert problem.startswith(f"error_routes: route {matcher!r} = {target!r}: "), problem
    assert why in problem, problem


def test_retryable_4xx_and_other_statuses_may_have_a_sequence() -> None:
    plan = RetryPlan.parse(
        "5m",
        failed_topic="failed",
        routes={"http_429": "1m", "http_408": "1m", "http_4xx": "2m", "http_302": "1m"},
    )
    assert len(plan.routes) == 4


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(
            main_topics="orders",
            error_routes={"bad name": "1m", "E": "nope", "F": "dlt:orders", "G": "dlt:l"},
            ledger_topic="l",
        )
    lines = [p for p in err.value.problems if p.startswith("error_routes")]
    assert len(lines) == 2 and "'bad name'" in lines[0] and "'E'" in lines[1], lines
    # once the routes parse, the cross-field rules name the topics
    with pytest.raises(ConfigError) as err:
        load_settings(main_topics="orders", error_routes={"F": "dlt:orders", "G": "dlt:l"},
                      ledger_topic="l")  # fmt: skip
    assert err.value.problems == [
        "error_routes: dlt:orders is a main topic",
        "error_routes: dlt:l is the ledger_topic",
    ]


def test_too_many_routes_and_too_many_tiers() -> None:
    many = {f"E{i}": "1m" for i in range(MAX_ROUTES + 1)}
    with pytest.raises(ErrorRouteError, match=f"at most {MAX_ROUTES}"):
        parse_error_routes(many)
    spread = {f"E{i}": f"{i + 1}s" for i in range(60)}
    with pytest.raises(ErrorRouteError, match="need 66 tier topics"):
        RetryPlan.parse("1h,2h,3h,4h,5h,6h", failed_topic="f", routes=spread)


def test_routes_from_value_rejects_non_text_matchers_and_odd_values() -> None:
    assert routes_from_value(None) == {} and routes_from_value("  ") == {}
    with pytest.raises(ValueError, match="not text"):
        routes_from_value({1: "1m"})
    with pytest.raises(ValueError, match="table of matcher"):
        routes_from_value(["E=1m"])
    with pytest.raises(ValueError, match="list of delays"):
        routes_from_value({"E": []})


# --- tiers of a plan with routes ------------------------------------------------------------------


def test_one_tier_per_distinct_delay_shared_by_every_sequence() -> None:
    assert PLAN.tier_topics == [
        "retry_5m",
        "retry_30m",
        "retry_1s",
        "retry_2s",
        "retry_10s",
        "retry_20s",
        "retry_40s",
        "retry_30s",
    ]
    assert PLAN.dlt_topics == ["orders.declined", "orders.poison"]
    assert PLAN.max_retries == 2  # retry_sequence's own
    assert PLAN.backoff.jitter == 0.0 and PLAN.jitter == pytest.approx(0.2)
    # the bound and floor of a tier use the largest jitter of the sequences that use it
    assert PLAN.tier_bounds["retry_10s"] == 12_000 and PLAN.tier_floors["retry_10s"] == 8_000
    assert PLAN.tier_bounds["retry_2s"] == 2_000 and PLAN.tier_floors["retry_2s"] == 2_000


def test_a_delay_used_by_a_jittered_and_a_plain_sequence_is_bounded_by_the_jitter() -> None:
    plan = RetryPlan.parse("10s,1m", failed_topic="f", routes={"E": "10s, jitter=50%"})
    assert plan.tier_topics == ["retry_10s", "retry_1m"]
    assert plan.tier_bounds == {"retry_10s": 15_000, "retry_1m": 60_000}
    assert plan.tier_floors == {"retry_10s": 5_000, "retry_1m": 60_000}


def test_without_routes_the_plan_is_unchanged() -> None:
    plan = RetryPlan.parse("1s,2s, jitter=10%", failed_topic="f")
    assert plan.routes == () and plan.dlt_topics == []
    assert plan.jitter == plan.backoff.jitter == pytest.approx(0.1)
    assert plan == RetryPlan.parse("1s,2s, jitter=10%", failed_topic="f", routes={})


# --- which route a failure takes ----------------------------------------------------------------


def test_a_route_for_a_base_class_catches_subclasses_the_most_derived_wins() -> None:
    class Deeper(Transient):
        pass

    assert where(first(CLASSIFY(Transient("t")))) == ("retry_1s", 1, None, b"Transient")
    assert where(first(CLASSIFY(Deeper("d")))) == ("retry_1s", 1, None, b"Transient")
    throttled = first(CLASSIFY(Throttled("slow down")))
    assert where(throttled) == ("retry_10s", 1, None, f"{__name__}.Throttled".encode())
    assert throttled.due_ms == 1_000 + 10_000  # draw 0.5: no jitter offset


def test_unrouted_failures_keep_the_default_sequence() -> None:
    route = first(CLASSIFY(RuntimeError("x")))
    assert where(route) == ("retry_5m", 1, None, None)
    assert route.due_ms == 1_000 + 300_000


def test_terminal_routes_dead_letter_at_once_with_the_dead_letter_headers() -> None:
    declined = first(CLASSIFY(Declined("card refused")))
    assert where(declined) == ("orders.declined", 0, "routed", b"Declined")
    assert declined.due_ms is None and h.header_value(declined.headers, h.RETRY_TIMESTAMP) is None
    for name, value in (
        (h.ORIGINAL_TOPIC, b"orders"),
        (h.ORIGINAL_PARTITION, b"3"),
        (h.ORIGINAL_OFFSET, b"41"),
        (h.ERROR_CLASS, f"{__name__}.Declined".encode()),
        (h.ERROR_MESSAGE, b"card refused"),
        (h.DEAD_REASON, b"routed"),
        (h.GROUP, b"g"),
        ("u", b"1"),
    ):
        assert h.header_value(declined.headers, name) == value, name
    assert where(first(CLASSIFY(KeyError("k")))) == ("failed", 0, "non_retryable", b"KeyError")


def test_non_retryable_failures_take_terminal_routes_but_never_sequences() -> None:
    assert where(first(CLASSIFY(Poison("bad")))) == ("orders.poison", 0, "routed", b"Poison")

    listed = Classifier(["Listed"])(Listed("no"))
    assert listed.outcome is Outcome.DEAD
    assert where(first(listed)) == ("failed", 0, "non_retryable", None)


def test_http_named_class_wins_over_status_which_wins_over_range() -> None:
    assert where(first(classify_http(503))) == ("retry_5m", 1, None, b"http_503")
    assert where(first(classify_http(500))) == ("retry_1s", 1, None, b"http_5xx")
    assert where(first(classify_http(503, error_name="Locked"))) == (
        "retry_30s",
        1,
        None,
        b"Locked",
    )
    assert where(first(classify_http(500, error_name="Unknown"))) == (
        "retry_1s",
        1,
        None,
        b"http_5xx",
    )
    assert where(first(classify_http(409, error_name="Declined"))) == (
        "orders.declined",
        0,
        "routed",
        b"Declined",
    )
    # a 4xx is non-retryable: a sequence route of the named class does not retry it
    assert where(first(classify_http(404, error_name="Locked"))) == (
        "failed",
        0,
        "non_retryable",
        None,
    )
    # the body's status word decides the outcome; the route still applies to a RETRY
    body = json.dumps({"status": "RETRY"}).encode()
    assert where(first(classify_http(404, body, "application/json", "Locked")))[:2] == (
        "retry_30s",
        1,
    )
    assert where(first(classify_http(429))) == ("retry_5m", 1, None, None)  # no route: default


def test_retryds_own_classes_are_matched_by_name() -> None:
    timed_out = HandlerResult(Outcome.RETRY, "timeout", "handler did not finish within 2s")
    assert where(first(timed_out)) == ("retry_2s", 1, None, b"timeout")
    conn = HandlerResult(Outcome.RETRY, "connection_error", "refused")
    assert where(first(conn)) == ("retry_5m", 1, None, None)


# --- continuing on a route through the tiers -------------------------------------------------


def test_a_tier_record_continues_on_its_route_then_exhausts() -> None:
    hop1 = first(CLASSIFY(Transient("a")))
    hop2 = again(hop1, CLASSIFY(Transient("b")))
    assert where(hop2) == ("retry_2s", 2, None, b"Transient")
    assert hop2.due_ms == 2_000 + 2_000
    dead = again(hop2, CLASSIFY(Transient("c")), 3_000)
    assert where(dead) == ("failed", 2, "exhausted", b"Transient")
    assert h.header_value(dead.headers, h.FIRST_FAILURE_TIMESTAMP) == b"1000"
    assert [k for k, _ in dead.headers].count(h.ROUTE) == 1


def test_a_later_failure_of_an_unrouted_class_stays_on_the_route() -> None:
    hop1 = first(CLASSIFY(Transient("a")))
    assert where(again(hop1, CLASSIFY(RuntimeError("other")))) == (
        "retry_2s",
        2,
        None,
        b"Transient",
    )


def test_a_later_failure_of_another_routed_class_switches_at_the_same_position() -> None:
    hop1 = first(CLASSIFY(Transient("a")))
    hop2 = again(hop1, CLASSIFY(Throttled("b")))
    assert where(hop2) == ("retry_20s", 2, None, f"{__name__}.Throttled".encode())
    # switching to a sequence shorter than the record's position exhausts it
    hop3 = again(hop2, CLASSIFY(Throttled("c")), 3_000)
    assert where(again(hop3, HandlerResult(Outcome.RETRY, "http_503", "x"), 4_000)) == (
        "failed",
        3,
        "exhausted",
        b"http_503",
    )
    # a terminal route takes a record on a route at once; a non-retryable one ends it
    assert where(again(hop1, CLASSIFY(Declined("d")))) == (
        "orders.declined",
        1,
        "routed",
        b"Declined",
    )
    assert where(again(hop1, CLASSIFY(ValueError("v")))) == (
        "failed",
        1,
        "non_retryable",
        b"Transient",
    )


def test_alternating_classes_cannot_retry_forever() -> None:
    route = first(CLASSIFY(Transient("a")))
    hops = 1
    classes = [Throttled("t"), Transient("t"), RuntimeError("r")]
    while not route.is_dead:
        route = again(route, CLASSIFY(classes[hops % 3]), 1_000 + hops)
        hops += 1
    assert hops <= 1 + max(len(r.delays_ms) for r in PLAN.routes)


def test_a_route_no_longer_configured_or_a_garbage_header_continues_on_retry_sequence() -> None:
    hop1 = first(CLASSIFY(Transient("a")))
    env = h.decode_tier_envelope(hop1.headers)
    assert env.route == "Transient"
    gone = RoutePlanner(RetryPlan.parse("5m,30m", failed_topic="failed", routes={"X": "1s"}))
    assert (gone.failure(env, hop1.headers, CLASSIFY(Transient("b")), 5).topic) == "retry_30m"
    for value in (b"\xff\xfe", b"a b", b"x" * 500, b"", b"\x00"):
        hdrs = [(k, v) for k, v in hop1.headers if k != h.ROUTE] + [(h.ROUTE, value)]
        env = h.decode_tier_envelope(hdrs)
        assert env.route is None, value
        assert planner().failure(env, hdrs, CLASSIFY(RuntimeError("r")), 5).topic == "retry_30m"


def test_a_route_header_naming_a_terminal_route_is_not_a_continuing_route() -> None:
    hop1 = first(CLASSIFY(RuntimeError("a")))
    hdrs = [*hop1.headers, (h.ROUTE, b"Declined")]
    env = h.decode_tier_envelope(hdrs)
    assert planner().failure(env, hdrs, CLASSIFY(RuntimeError("b")), 5).topic == "retry_30m"


def test_headers_are_replaced_never_appended_along_a_route() -> None:
    route = first(CLASSIFY(Transient("a")))
    route = again(route, CLASSIFY(Transient("b")))
    names = [k for k, _ in route.headers]
    assert len(names) == len(set(names))


# --- classification feeds the matcher ---------------------------------------------------------


def test_classifier_and_http_results_carry_what_routes_match_on() -> None:
    result = CLASSIFY(Throttled("x"))
    assert result.error_type is Throttled and result.error_class == f"{__name__}.Throttled"
    assert result == HandlerResult(Outcome.RETRY, f"{__name__}.Throttled", "x")
    assert classify_http(503, error_name="Locked").error_name == "Locked"
    assert classify_http(200, error_name="Locked").outcome is Outcome.SUCCESS


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("InventoryLocked", "InventoryLocked"),
        ("  payments.Declined  ", "payments.Declined"),
        ("rate-limited", "rate-limited"),
        ("", None),
        ("two words", None),
        ("x" * (MAX_NAME + 1), None),
        ("9lives", None),
        ("Ünïcode", None),
        ("a\r\nX-Injected: 1", None),
        (None, None),
        (b"bytes", None),
    ],
)
def test_error_name_takes_short_tokens_only(raw: object, expected: str | None) -> None:
    assert error_name(raw) == expected


@given(st.text(max_size=300))
def test_error_name_never_raises_and_what_it_keeps_can_travel_in_a_header(raw: str) -> None:
    name = error_name(raw)
    if name is not None:
        assert name.isascii() and len(name) <= MAX_NAME and " " not in name
        route = first(classify_http(503, error_name=name))
        assert route.topic in PLAN.tier_topics


def test_envelope_round_trip_keeps_the_route() -> None:
    env = h.Envelope("orders", 1, 2, 3, 1, 4, 5, "E", "m", None, "g", "http_5xx")
    assert h.decode_tier_envelope(h.encode_envelope(env)) == env
    assert h.decode_lenient(h.encode_envelope(env))[h.ROUTE] == "http_5xx"
