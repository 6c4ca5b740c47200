"""The extender's verbs as plain methods (service.Extender), without HTTP: what the Flask factory and the
lean server both route to."""

from __future__ import annotations

import orjson
import pytest

from share_core.assignment import parse_assignment
from share_core.contract import EXTENDER_PREFIX
from share_core.fake import FakeKube
from share_scheduler.app import create_app
from share_scheduler.service import NOT_SYNCED
from share_scheduler.service import Extender
from tests.unit.scheduler.conftest import bind_args
from tests.unit.scheduler.conftest import fast_backoff
from tests.unit.scheduler.conftest import filter_args
from tests.unit.scheduler.conftest import make_node
from tests.unit.scheduler.conftest import make_pod
from tests.unit.scheduler.conftest import wait_until


def body(obj: object) -> bytes:
    return orjson.dumps(obj)


@pytest.fixture
def extender() -> Extender:
    kube = FakeKube()
    kube.add_node(make_node("n1", [16, 16]))
    kube.add_node(make_node("n2", [16]))
    ext = Extender(kube, policy="binpack", sync_backoff=fast_backoff)
    ext.start()
    wait_until(lambda: ext.cache.synced, what="first sync")
    yield ext
    ext.stop()


def test_filter_then_bind_without_http(extender: Extender) -> None:
    kube = extender.binder.kube
    pod = make_pod("p", 12)
    kube.add_pod(pod)
    status, answer = extender.filter(body(filter_args(pod, ["n1", "n2"])))
    # binpack, filter keeps the best: both nodes leave 4 of a 16 GiB GPU; n2 is the fuller node
    assert (status, answer["Error"], answer["NodeNames"]) == (200, "", ["n2"])
    node = "n2"
    status, answer = extender.bind(body(bind_args(pod, node)))
    assert (status, answer) == (200, {"Error": ""})
    bound = kube.get_pod("default", "p")
    assert bound["spec"]["nodeName"] == node
    assert parse_assignment(bound["metadata"]["annotations"]) is not None


def test_bad_bodies_are_400_with_the_problem_named(extender: Extender) -> None:
    status, answer = extender.filter(b"{not json")
    assert status == 400 and "JSON" in answer["Error"]
    status, answer = extender.bind(b"")
    assert status == 400 and answer["Error"] == "request body is empty"
    status, answer = extender.prioritize(body({"Pod": {}, "NodeNames": "n1"}))
    assert status == 400 and "NodeNames" in answer["Error"]


def test_a_pod_we_cannot_serve_is_a_200_error_that_names_it(extender: Extender) -> None:
    status, answer = extender.filter(body(filter_args(make_pod("frac", "1.5"), ["n1"])))
    assert status == 200 and answer["Error"].startswith("pod default/frac:")


def test_not_synced_answers_retry() -> None:
    kube = FakeKube()
    ext = Extender(kube, sync_backoff=fast_backoff)  # never started: the cache has not synced
    status, answer = ext.filter(body(filter_args(make_pod("p", 4), ["n1"])))
    assert (status, answer["Error"]) == (200, NOT_SYNCED)
    status, answer = ext.bind(body(bind_args(make_pod("p", 4), "n1")))
    assert (status, answer) == (200, {"Error": NOT_SYNCED})


def test_the_factory_routes_to_the_extender_it_is_given(extender: Extender) -> None:
    app = create_app(extender=extender, start_sync=False)
    assert app.extensions["gpushare"]["extender"] is extender
    assert set(app.extensions["gpushare"]["verbs"]) == {
        f"{EXTENDER_PREFIX}/{v}" for v in ("filter", "prioritize", "bind", "preempt")
    }
    resp = app.test_client().post(f"{EXTENDER_PREFIX}/filter", data=b"[]")
    assert resp.status_code == 400 and "ExtenderArgs" in resp.get_json()["Error"]
    with pytest.raises(ValueError, match="only when create_app builds"):
        create_app(extender=extender, start_sync=False, policy="frag")
    with pytest.raises(ValueError, match="KubeClient or an Extender"):
        create_app(start_sync=False)
