"""``client.watch()`` against the real servicers (in-memory cluster): the events of each
change, in log order; a stream lost with its member resumed on another from the last revision
+ 1, nothing missed or repeated; Compacted naming the current revision; prefixes a principal
may not read refused."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from coordinator.client.exceptions import Compacted, InvalidArgument
from coordinator.client.sync import FencingClient
from coordinator.server.auth import Principal
from coordinator.server.errors import ServiceError
from coordinator.server.watch_service import authorize_prefix
from testsupport.inmemory import InMemoryCluster

DEADLINE_S = 10.0


def wait_for(condition, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


class Collector:
    """Runs a watcher in a thread, keeping every event it yields (or the error it raised)."""

    def __init__(self, watcher) -> None:
        self.watcher = watcher
        self.events: list = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.watcher:
                self.events.append(event)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc

    def stop(self) -> None:
        self.watcher.close()
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive()


@pytest.fixture
def cluster():
    with InMemoryCluster(3) as running:
        yield running


def test_watch_reports_each_change_with_its_log_index(cluster):
    with FencingClient(cluster.endpoints) as client:
        start = client.describe("jobs/a").header.applied_index + 1  # nothing under jobs/ yet
        collector = Collector(client.watch("jobs/", start_revision=start))
        lease = client.acquire("jobs/a", ttl_ms=60_000, holder="h1")
        write = client.write("jobs/a", "k", b"v1", token=lease.token)
        client.acquire("other/x", ttl_ms=60_000, holder="h2")  # outside the prefix
        deleted = client.delete("jobs/a", "k", token=lease.token)
        released = client.release("jobs/a", lease.token)
        wait_for(lambda: len(collector.events) == 4)
        collector.stop()
    events = collector.events
    assert [e.type for e in events] == ["ACQUIRED", "WRITTEN", "DELETED", "RELEASED"]
    assert [e.revision for e in events] == [
        lease.header.applied_index, write.header.applied_index,
        deleted.header.applied_index, released.header.applied_index,
    ]
    assert (events[0].holder, events[0].token) == ("h1", lease.token)
    assert (events[1].key, events[1].value, events[1].version) == ("k", b"v1", write.version)
    assert all(e.resource == "jobs/a" for e in events)


def test_a_watch_that_loses_its_member_resumes_elsewhere_with_every_event_once(cluster):
    with FencingClient(cluster.endpoints) as client:
        lease = client.acquire("jobs/a", ttl_ms=60_000, holder="h1")
        collector = Collector(client.watch("jobs/", start_revision=lease.header.applied_index))
        versions = []
        for n in range(10):
            versions.append(client.write("jobs/a", "k", str(n).encode(), token=lease.token).version)
            if n == 4:
                wait_for(lambda: len(collector.events) >= 3)
                cluster.stop_node(0)  # the member the watch streams from (its first endpoint)
        wait_for(lambda: len(collector.events) == 11)
        collector.stop()
    assert collector.error is None
    assert collector.watcher.resumes >= 1
    events = collector.events
    assert events[0].type == "ACQUIRED"
    assert [e.version for e in events[1:]] == versions  # each write once, in order
    assert [e.revision for e in events] == sorted({e.revision for e in events})


def test_a_start_older_than_the_history_raises_compacted_with_the_current_revision(cluster):
    with FencingClient(cluster.endpoints) as client:
        lease = client.acquire("jobs/a", ttl_ms=60_000, holder="h1")
        for member in cluster.members:
            assert member.watch is not None
            member.watch.history_bytes_max = 1  # keeps the newest entry only
        for n in range(3):
            last = client.write("jobs/a", "k", str(n).encode(), token=lease.token)
        with pytest.raises(Compacted) as caught:
            list(client.watch("jobs/", start_revision=1))
    assert caught.value.current_revision == last.header.applied_index
    assert f"current revision {last.header.applied_index}" in str(caught.value)


def test_a_bad_prefix_is_refused_before_anything_is_watched(cluster):
    with FencingClient(cluster.endpoints) as client, pytest.raises(InvalidArgument) as caught:
        list(client.watch("jobs/ bad"))
    assert "prefix" in str(caught.value)


def test_a_principal_may_watch_only_inside_its_prefixes():
    orders = Principal("orders", ("orders/",), admin=False)
    authorize_prefix(None, orders, "orders/eu/")  # type: ignore[arg-type]  # core unused here
    for outside in ("", "order", "jobs/"):
        with pytest.raises(ServiceError) as caught:
            authorize_prefix(None, orders, outside)  # type: ignore[arg-type]
        assert caught.value.reason == "PERMISSION_DENIED"


def test_the_asyncio_client_watches_too(cluster):
    from coordinator.client.sync import AsyncFencingClient

    async def main() -> list:
        async with AsyncFencingClient(cluster.endpoints) as client:
            lease = await client.acquire("jobs/a", ttl_ms=60_000, holder="h1")
            watcher = client.watch("jobs/", start_revision=lease.header.applied_index)
            await client.write("jobs/a", "k", b"v", token=lease.token)
            seen = []
            async for event in watcher:
                seen.append(event.type)
                if len(seen) == 2:
                    watcher.close()
            return seen

    assert asyncio.run(asyncio.wait_for(main(), DEADLINE_S)) == ["ACQUIRED", "WRITTEN"]


def test_election_observe_follows_the_watch_without_a_read_per_interval(cluster):
    from coordinator.client.election import AsyncElection, Election

    resource = "election/scheduler"
    with FencingClient(cluster.endpoints) as a, FencingClient(cluster.endpoints) as watcher:
        alice = Election(a, resource, ttl_ms=60_000)
        stop = threading.Event()
        seen: list = []
        observer = threading.Thread(
            target=lambda: seen.extend(Election(watcher, resource, ttl_ms=60_000).observe(interval_s=0.05, stop=stop)),
            daemon=True)
        observer.start()
        wait_for(lambda: seen == [None])
        alice.campaign("alice")
        wait_for(lambda: seen == [None, "alice"])
        alice.resign()
        wait_for(lambda: seen == [None, "alice", None])
        stop.set()
        observer.join(DEADLINE_S)
        assert not observer.is_alive()
        assert len(cluster.calls_to("Describe")) == 1  # the first read only: no polling

    async def async_observe() -> list:
        from coordinator.client.sync import AsyncFencingClient

        async with AsyncFencingClient(cluster.endpoints) as client:
            bob = AsyncElection(client, resource, ttl_ms=60_000)
            got: list = []
            async for leader in bob.observe():
                got.append(leader)
                if leader is None and len(got) == 1:
                    await bob.campaign("bob")
                elif leader == "bob":
                    await bob.resign()
                else:
                    break
            return got

    assert asyncio.run(asyncio.wait_for(async_observe(), DEADLINE_S)) == [None, "bob", None]


def test_a_watcher_left_inside_an_entrys_events_resumes_at_that_entry():
    from coordinator.client.watch import WatchEvent, _Position

    position = _Position("jobs/", 5)
    expired, granted = WatchEvent("EXPIRED", 9, "jobs/a"), WatchEvent("ACQUIRED", 9, "jobs/a")
    events = position.each(9, [expired, granted])
    assert next(events) is expired
    assert position.revision == 8  # the entry's second event not taken yet: resume at 9
    assert next(events) is granted
    assert position.revision == 9


def test_a_third_watcher_from_one_caller_is_refused_and_its_slot_comes_back(cluster):
    from coordinator.client.exceptions import LimitExceeded

    with FencingClient(cluster.endpoints[:1]) as client:
        first, second = Collector(client.watch("jobs/")), Collector(client.watch("jobs/"))
        member = cluster.members[0]
        assert member.watch is not None
        wait_for(lambda: member.watch.open_count() == 2)
        with pytest.raises(LimitExceeded) as caught:
            list(client.watch("jobs/"))
        assert caught.value.metadata["limit"] == "watchers_per_principal_max"
        first.stop()
        wait_for(lambda: member.watch.open_count() == 1)  # a closed stream gives its slot back
        third = Collector(client.watch("jobs/"))
        wait_for(lambda: member.watch.open_count() == 2)
        second.stop()
        third.stop()
        assert first.error is second.error is third.error is None
