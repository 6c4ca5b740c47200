"""Pages: a paginated list read with the next page fetched while the caller works on this one."""

from __future__ import annotations

import threading
import time

import pytest

from share_core.kube import Gone
from share_core.kube import Pages


def _server(pages: int, per_page: int, fail_at: int | None = None, log: list[str] | None = None):
    def fetch(cont):
        n = int(cont or 0)
        if log is not None:
            log.append(f"fetch {n}")
        if fail_at is not None and n == fail_at:
            raise Gone("continue token expired", 410)
        items = [{"metadata": {"name": f"p{n}-{i}"}} for i in range(per_page)]
        meta = {"resourceVersion": "42"}
        if n + 1 < pages:
            meta["continue"] = str(n + 1)
        return {"items": items, "metadata": meta}

    return fetch


def test_pages_arrive_in_order_and_the_list_version_is_known_at_the_end():
    pages = Pages(_server(3, 4))
    got = [[i["metadata"]["name"] for i in page] for page in pages]
    assert got == [[f"p{n}-{i}" for i in range(4)] for n in range(3)]
    assert pages.count == 12 and pages.resource_version == "42"


def test_the_next_page_is_fetched_while_the_caller_works():
    log: list[str] = []
    pages = iter(Pages(_server(3, 2, log=log)))
    next(pages)
    deadline = time.monotonic() + 2
    while "fetch 1" not in log and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log[:2] == ["fetch 0", "fetch 1"]  # page 1 was read before the caller asked for it
    assert "fetch 2" not in log  # but no further: at most two pages are alive


def test_an_error_reaches_the_caller_after_the_pages_before_it():
    seen = []
    with pytest.raises(Gone):
        for page in Pages(_server(5, 1, fail_at=2)):
            seen.append(page)
    assert len(seen) == 2


def test_a_caller_that_stops_early_ends_the_fetcher():
    before = threading.active_count()
    pages = Pages(_server(1000, 1))
    for n, _ in enumerate(pages):
        if n == 3:
            break
    deadline = time.monotonic() + 3
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before


def test_a_whole_list_is_one_page():
    pages = Pages(items=[{"a": 1}, {"a": 2}], resource_version="7")
    assert list(pages) == [[{"a": 1}, {"a": 2}]] and pages.resource_version == "7" and pages.count == 2
