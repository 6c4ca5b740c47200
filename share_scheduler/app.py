"""The extender's HTTP face: a Flask application factory over `share_scheduler.service.Extender`.

The factory builds the Extender (or takes one) and routes to it: the scheduling verbs, inspect, health,
version and metrics. Everything that decides lives in the Extender and below; this module only maps
HTTP onto it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from flask import Flask
from flask import Response
from flask import request
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException

import share_core
from share_core.contract import EXTENDER_PREFIX
from share_core.kube import KubeClient
from share_scheduler.service import Extender
from share_scheduler.service import TimedVerb
from share_scheduler.starvation import hold_summary

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # a NodeList of 5,000 full nodes is tens of MB


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status=status, mimetype="application/json")


def create_app(
    kube: KubeClient | None = None, *, extender: Extender | None = None, start_sync: bool = True, **options: Any
) -> Flask:
    """Build the extender's Flask app: over `extender`, or a new Extender(kube, **options) (see
    service.Extender for the options). With `start_sync` the list+watch threads start now (call in the
    serving process). `app.extensions["gpushare"]` exposes the parts."""
    if extender is None:
        if kube is None:
            raise ValueError("create_app needs a KubeClient or an Extender")
        extender = Extender(kube, **options)
    elif options:
        raise ValueError(f"options {sorted(options)} apply only when create_app builds the Extender")
    verbs = extender.timed_verbs()
    app = Flask("share_scheduler")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY
    app.extensions["gpushare"] = {
        "extender": extender,
        "cache": extender.cache,
        "binder": extender.binder,
        "syncer": extender.syncer,
        "metrics": extender.metrics,
        "memo": extender.memo,
        "index": extender.index,
        "events": extender.events,
        "starvation": extender.starvation,
        "verbs": verbs,
    }
    for path, fn in verbs.items():
        app.add_url_rule(path, endpoint=path.rsplit("/", 1)[-1], view_func=_verb_route(fn), methods=["POST"])
    _add_read_routes(app, extender)
    if start_sync:
        extender.start()
    return app


def _verb_route(fn: TimedVerb) -> Callable[[], Response]:
    def route() -> Response:
        status, body = fn(request.get_data(cache=False))  # over MAX_CONTENT_LENGTH: 413 below
        return Response(body, status=status, mimetype="application/json")

    return route


def _add_read_routes(app: Flask, extender: Extender) -> None:
    cache, metrics = extender.cache, extender.metrics

    def with_holds(view: dict[str, Any], node: str | None = None) -> dict[str, Any]:
        """The view plus the memory held for pods not bound yet (preemption, reservations, consolidation)."""
        holds = hold_summary(cache.holds.holds(), time.time())
        view["holds"] = [h for h in holds if node is None or h["node"] == node]
        return view

    @app.get(f"{EXTENDER_PREFIX}/inspect")
    def inspect_all() -> Response:
        return _json(with_holds(cache.snapshot()))

    @app.get(f"{EXTENDER_PREFIX}/inspect/<node>")
    def inspect_node(node: str) -> Response:
        view = cache.snapshot(node)
        if not view["nodes"]:
            return _json({"Error": f"node {node} is not known to the gpushare extender"}, 404)
        return _json(with_holds(view, node))

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
        policy = extender.policy
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
        if isinstance(exc, HTTPException):
            return _json({"Error": exc.description or exc.name}, exc.code or 500)
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return _json({"Error": f"internal error: {exc!r}"}, 500)
