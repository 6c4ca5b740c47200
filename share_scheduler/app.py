"""The extender's HTTP face: a Flask application factory over the cache, the policy and the binder.

Status codes: kube-scheduler treats any status but 200 as a failed call and throws the body away, so
a request it could have sent (a well-formed ExtenderArgs for a pod we cannot place) is answered 200
with `Error` set — that message reaches the pod's FailedScheduling event. A body kube-scheduler would
never send (not JSON, missing or mistyped fields) is answered 400, still with a JSON `Error`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
from flask import Flask, Response, request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

import share_core
from share_core.contract import EXTENDER_PREFIX, MemoryUnit
from share_core.events import EventQueue
from share_core.kube import KubeClient
from share_core.request import InvalidRequest, PodRequest
from share_core.retry import Backoff
from share_scheduler.binder import BIND_EVENTS, Binder, BindError, parse_bind_args
from share_scheduler.cache import ClusterCache, demand_of
from share_scheduler.extender import (
    FILTER_KEEPS,
    BadRequest,
    BestNodeIndex,
    ScoreMemo,
    best_nodes,
    filter_nodes,
    filter_result,
    invalid_request_message,
    parse_extender_request,
    pod_demand,
    policy_scores,
    prioritize,
)
from share_scheduler.placement import Policy, learns, make_policy
from share_scheduler.syncer import Syncer

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # a NodeList of 5,000 full nodes is tens of MB

# Fine where a healthy extender answers (filter ~1 ms, bind one API call ~5-20 ms), coarse beyond.
_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.035, 0.05,
            0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # fmt: skip


class _SyncedCollector:
    """gpushare_cache_synced, read at scrape time."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def collect(self) -> Any:
        synced = GaugeMetricFamily("gpushare_cache_synced", "1 once nodes and pods were fully listed")
        synced.add_metric([], 1 if self.cache.synced else 0)
        yield synced


def _label(value: str) -> str:
    """A label value escaped as the text exposition format asks (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class GpuGauges:
    """Per-GPU gauges (allocated, total) as exposition text, re-rendered only for nodes that changed.

    At 5,000 nodes x 8 GPUs, building them per scrape through prometheus_client's collector (the
    cache's /inspect view, a sample object per value) cost ~1 s of CPU holding the GIL, and the
    serial filter path stalled behind every scrape. Each node's lines are kept, and a scrape
    re-renders only the nodes the cache logged as changed since the last one (ClusterCache.node_changes)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._cursor: int | None = None
        self._allocated: dict[str, str] = {}
        self._total: dict[str, str] = {}
        self._lock = threading.Lock()

    def text(self) -> str:
        with self._lock:
            cursor, changed, afresh = self.cache.node_changes(self._cursor)
            if afresh:
                self._allocated, self._total = {}, {}
            for name, snap in changed:
                if snap is None:
                    self._allocated.pop(name, None)
                    self._total.pop(name, None)
                    continue
                allocated, total = [], []
                node = _label(name)
                for g, used in zip(snap.gpus, snap.used, strict=True):
                    labels = f'{{gpu="{g.index}",node="{node}",uuid="{_label(g.uuid)}"}} '
                    allocated.append(f"gpushare_gpu_memory_allocated{labels}{floatToGoString(used)}\n")
                    total.append(f"gpushare_gpu_memory_total{labels}{floatToGoString(g.memory if g.healthy else 0)}\n")
                self._allocated[name] = "".join(allocated)
                self._total[name] = "".join(total)
            self._cursor = cursor
            names = sorted(self._allocated)
            unit = self.cache.unit.value
            return "".join(
                [
                    f"# HELP gpushare_gpu_memory_allocated GPU memory promised to pods ({unit})\n",
                    "# TYPE gpushare_gpu_memory_allocated gauge\n",
                    *(self._allocated[n] for n in names),
                    f"# HELP gpushare_gpu_memory_total GPU memory ({unit}); 0 when unhealthy\n",
                    "# TYPE gpushare_gpu_memory_total gauge\n",
                    *(self._total[n] for n in names),
                ]
            )


class Metrics:
    def __init__(self, cache: ClusterCache) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "gpushare_extender_request_seconds",
            "filter/prioritize/bind latency",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.bind_failures = Counter(
            "gpushare_bind_failures", "binds that returned Error, by reason", ["reason"], registry=self.registry
        )
        self.binds = Counter("gpushare_binds", "successful binds", registry=self.registry)
        self.bind_pod_reads = Counter(
            "gpushare_bind_pod_reads",
            "binds that had to read the pod from the API server (filter had not seen it: e.g. after a restart)",
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "gpushare_events_dropped",
            "Events not posted because the queue was full (the API server is slow)",
            registry=self.registry,
        )
        self.events_failed = Counter(
            "gpushare_events_failed", "Events the API server refused or did not answer", registry=self.registry
        )
        self.registry.register(_SyncedCollector(cache))
        self.gpus = GpuGauges(cache)


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, mimetype="application/json")


def create_app(
    kube: KubeClient,
    policy: Policy | str = "binpack",
    unit: MemoryUnit = MemoryUnit.GiB,
    cache: ClusterCache | None = None,
    start_sync: bool = True,
    watch_timeout: int = 300,
    assume_ttl: float | None = None,
    sync_backoff: Callable[[], Backoff] = Backoff,
    filter_keeps: str = "best",
    bind_events: str = "failures",
) -> Flask:
    """Build the extender. With `start_sync` the list+watch threads start now (call in the serving
    process). `app.extensions["gpushare"]` exposes the parts.
    `filter_keeps`: see extender.FILTER_KEEPS; `bind_events`: "failures" (Events for failed binds) or "all"
    (also one per bind, naming the GPU: an API write per pod)."""
    if isinstance(policy, str):
        policy = make_policy(policy)
    if bind_events not in BIND_EVENTS:
        raise ValueError(f"bind_events must be one of {', '.join(BIND_EVENTS)}, not {bind_events!r}")
    if filter_keeps not in FILTER_KEEPS:
        raise ValueError(f"filter_keeps must be one of {', '.join(FILTER_KEEPS)}, not {filter_keeps!r}")
    keep_best = filter_keeps == "best"
    random_ties = bool(getattr(policy, "random_ties", False))  # bestfit: kube-scheduler breaks its ties
    if cache is None:
        kw: dict[str, Any] = {"unit": unit}
        if assume_ttl is not None:
            kw["assume_ttl"] = assume_ttl
        cache = ClusterCache(**kw)
    metrics = Metrics(cache)
    events = EventQueue(kube, on_drop=metrics.events_dropped.inc, on_error=metrics.events_failed.inc)
    binder = Binder(
        kube,
        cache,
        policy,
        unit,
        on_failure=lambda r: metrics.bind_failures.labels(r).inc(),
        events=events,
        on_pod_read=metrics.bind_pod_reads.inc,
        assigned_events=bind_events == "all",
    )
    memo = ScoreMemo(policy)
    index = BestNodeIndex(policy, cache, memo, binder.policy_lock) if BestNodeIndex.usable(policy) else None

    def observe(req: PodRequest) -> None:
        # Workload-aware policies (frag) learn the pod-size distribution from every pod we see,
        # the initial list included, so a restarted extender relearns it from the cluster.
        with binder.policy_lock:
            policy.observe(demand_of(req))
        memo.invalidate()  # a learning policy may now score a view differently (no-op for binpack)

    if learns(policy):  # reading every pod's request costs a third of the first sync: only when it counts
        cache.set_observer(observe)
    if hasattr(policy, "set_gpu_unit"):  # frag: its gap price packs shares into the cluster's largest GPU

        def largest_gpu(units: int) -> None:
            with binder.policy_lock:
                policy.set_gpu_unit(units or None)
            memo.invalidate()

        cache.set_largest_gpu_observer(largest_gpu)
    syncer = Syncer(kube, cache, watch_timeout=watch_timeout, backoff=sync_backoff)

    app = Flask("share_scheduler")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY
    app.extensions["gpushare"] = {
        "cache": cache,
        "binder": binder,
        "syncer": syncer,
        "metrics": metrics,
        "memo": memo,
        "index": index,
        "events": events,
    }

    def read_body(raw: bytes) -> Any:
        if not raw:
            raise BadRequest("request body is empty")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not JSON: {exc}") from exc

    def do_filter(raw: bytes) -> tuple[int, Any]:
        try:
            args = parse_extender_request(raw)
        except BadRequest as exc:
            return 400, filter_error(str(exc))
        try:
            wanted = pod_demand(args.pod)
        except InvalidRequest as exc:
            return 200, filter_result(args, None, {}, {}, invalid_request_message(args.pod, exc))
        if wanted is None:
            return 200, filter_result(args, None, {}, {})  # not ours: pass every node through
        if not cache.synced:
            return 200, filter_result(args, None, {}, {}, "gpushare extender is still syncing its cache; retry")
        request, demand = wanted
        binder.remember(args.pod, request)
        if keep_best:
            if index is not None:
                passed = index.best(demand, args.names)
            else:
                entries = cache.entries(args.names)
                passed = best_nodes(policy_scores(policy, demand, entries, memo, binder.policy_lock), random_ties)
            failed, unresolvable = {}, {}
            if not passed:
                _, failed, unresolvable = filter_nodes(demand, cache.entries(args.names), unit)
        else:
            passed, failed, unresolvable = filter_nodes(demand, cache.entries(args.names), unit)
        if len(passed) == 1:
            # kube-scheduler takes a lone node without scoring (schedulePod): hold its GPUs for the bind.
            binder.hold(args.pod, passed[0], demand)
        return 200, filter_result(args, passed, failed, unresolvable)

    def do_prioritize(raw: bytes) -> tuple[int, Any]:
        try:
            args = parse_extender_request(raw)
            wanted = pod_demand(args.pod)
        except BadRequest as exc:
            return 400, {"Error": str(exc)}
        except InvalidRequest as exc:
            # kube-scheduler only logs a failed prioritize; 400 keeps our scores out of the sum.
            return 400, {"Error": str(exc)}
        if wanted is None:
            return 200, [{"Host": n, "Score": 0} for n in args.names]
        _, demand = wanted
        entries = cache.entries(args.names)
        return 200, prioritize(policy, demand, entries, memo, binder.policy_lock)

    def do_bind(raw: bytes) -> tuple[int, Any]:
        try:
            args = parse_bind_args(read_body(raw))
        except BadRequest as exc:
            metrics.bind_failures.labels("bad_request").inc()
            return 400, {"Error": str(exc)}
        if not cache.synced:
            metrics.bind_failures.labels("not_synced").inc()
            return 200, {"Error": "gpushare extender is still syncing its cache; retry"}
        try:
            binder.bind(args)
        except BindError as exc:
            return 200, {"Error": str(exc)}
        metrics.binds.inc()
        return 200, {"Error": ""}

    def timed(verb: str, fn: Callable[[bytes], tuple[int, Any]]) -> Callable[[bytes], tuple[int, bytes]]:
        latency = metrics.latency.labels(verb)

        def run(raw: bytes) -> tuple[int, bytes]:
            start = time.perf_counter()
            try:
                status, body = fn(raw)
                return status, orjson.dumps(body)
            finally:
                latency.observe(time.perf_counter() - start)

        return run

    # The scheduling verbs as plain functions, request body in, (status, JSON body) out: the Flask
    # routes below call them, and so does share_scheduler.server's lean front for kube-scheduler.
    verbs = {"filter": timed("filter", do_filter), "prioritize": timed("prioritize", do_prioritize),
             "bind": timed("bind", do_bind)}  # fmt: skip
    app.extensions["gpushare"]["verbs"] = {f"{EXTENDER_PREFIX}/{verb}": fn for verb, fn in verbs.items()}

    def verb_route(verb: str) -> Callable[[], Response]:
        fn = verbs[verb]

        def route() -> Response:
            status, body = fn(request.get_data(cache=False))  # over MAX_CONTENT_LENGTH: 413 below
            return Response(body, status=status, mimetype="application/json")

        route.__name__ = f"{verb}_route"
        return route

    for verb in verbs:
        app.add_url_rule(f"{EXTENDER_PREFIX}/{verb}", view_func=verb_route(verb), methods=["POST"])

    @app.get(f"{EXTENDER_PREFIX}/inspect")
    def inspect_all() -> Response:
        return _json(cache.snapshot())

    @app.get(f"{EXTENDER_PREFIX}/inspect/<node>")
    def inspect_node(node: str) -> Response:
        view = cache.snapshot(node)
        if not view["nodes"]:
            return _json({"Error": f"node {node} is not known to the gpushare extender"}, 404)
        return _json(view)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        if cache.synced:
            return _json({"status": "ready"})
        return _json({"status": "syncing: nodes and pods not yet fully listed"}, 503)

    @app.get("/version")
    def version() -> Response:
        return _json({"version": share_core.__version__, "policy": getattr(policy, "name", str(policy))})

    @app.get("/metrics")
    def metrics_route() -> Response:
        text = generate_latest(metrics.registry) + metrics.gpus.text().encode()
        return Response(text, mimetype=CONTENT_TYPE_LATEST)

    @app.errorhandler(413)
    def too_large(_: Any) -> Response:
        return _json({"Error": f"request body larger than {MAX_BODY} bytes"}, 413)

    @app.errorhandler(Exception)
    def unhandled(exc: Exception) -> Response:
        from werkzeug.exceptions import HTTPException

        if isinstance(exc, HTTPException):
            return _json({"Error": exc.description or exc.name}, exc.code or 500)
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return _json({"Error": f"internal error: {exc!r}"}, 500)

    if start_sync:
        syncer.start()
    return app


def filter_error(message: str) -> dict[str, Any]:
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}
