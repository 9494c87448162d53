"""The pulled exchanges of a query (``binx``, ``http``; ``exchange.py``): publishing a fragment's output
into this node's BinX server, pulling a source's pages, and freeing the buffers when the query ends.

Mixed into ``QueryRole``, which keeps the per-query state and provides the hooks; the ``push`` exchange
(credit streams) stays in the role.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from sparkbus.bus import contract as c
from sparkbus.roles.query import exchange as x
from sparkbus.roles.query.config import QueryConfig
from sparkbus.roles.query.errors import ErrorCode
from sparkbus.roles.query.messages import QueryId
from sparkbus.roles.query.state import FragmentRun, Phase, QueryState, Step


class PulledExchange:
    """Publishing, pulling and the buffers' end under ``binx`` and ``http``."""

    member: str
    config: QueryConfig
    queries: dict[QueryId, QueryState]
    peers_up: set[str]
    counters: Counter[str]
    _chosen: dict[QueryId, str]
    _tags: dict[str, QueryId]
    _next_tag: int
    _handed: dict[str, dict[x.Publish, None]]

    def _fail(self, q: QueryState, code: ErrorCode, message: str, origin: str, out: list[c.Action]) -> None:
        raise NotImplementedError

    def _failed_at(self, q: QueryState, exc: Exception, where: str, out: list[c.Action]) -> None:
        raise NotImplementedError

    def _maybe_complete(self, q: QueryState, out: list[c.Action]) -> None:
        raise NotImplementedError

    def _receiving(self, q: QueryState, edge: int) -> FragmentRun | None:
        raise NotImplementedError

    def _run_fragment(
        self, q: QueryState, run: FragmentRun, received: pa.Table | None, out: list[c.Action]
    ) -> None:
        raise NotImplementedError

    def _tag(self, q: QueryState, registry: dict[str, Any], item: Any) -> str:
        self._next_tag += 1
        tag = f"query/{self._next_tag}"
        registry[tag] = item
        self._tags[tag] = q.id
        return tag

    def _create_buffers(self, q: QueryState, edge: int, out: list[c.Action]) -> None:
        """binx: create this node's buffers of ``edge`` at start, so that a consumer's fetch arriving before
        the pages long-polls on its buffer instead of backing off on an unknown one."""
        assert q.start is not None
        receivers = next(
            f.members for f in q.start.decoded if f.receive is not None and f.receive.edge == edge
        )
        for index, peer in enumerate(receivers):
            if peer != self.member:
                pub = x.Publish(q.id, edge, index)
                q.published.append((peer, pub))
                out.append(x.create_call(pub))

    def _publish(
        self,
        q: QueryState,
        edge: int,
        receivers: tuple[str, ...],
        parts: list[pa.Table | None],
        out: list[c.Action],
    ) -> None:
        """binx: put each receiver's part into this node's BinX server (or fold it here, for ourselves)."""
        for index, (peer, part) in enumerate(zip(receivers, parts, strict=True)):
            if peer != self.member and peer not in self.peers_up:
                self._fail(
                    q, ErrorCode.MEMBER_CONNECTION, f"no connection to member {peer}", self.member, out
                )
                return
            data = x.pages(part, self.config.batch_bytes)
            self.counters["batches_out"] += len(data)
            self.counters["bytes_out"] += sum(map(len, data))
            if peer == self.member:
                self._take_pages(q, edge, peer, data, True, out)
            else:
                pub = x.Publish(q.id, edge, index)
                out.append(x.publish_call(self._tag(q, q.publishing, pub), pub, data))
            if q.phase is not Phase.RUNNING:
                return
        self._maybe_complete(q, out)

    def _take_pages(
        self, q: QueryState, edge: int, peer: str, data: list[bytes], complete: bool, out: list[c.Action]
    ) -> None:
        """binx: fold pages from ``peer`` into the fragment receiving ``edge``; run it after the last one."""
        run = self._receiving(q, edge)
        if run is None or run.inbox is None or peer not in run.waiting:
            self._fail(q, ErrorCode.GENERIC, f"unexpected pages from {peer} on edge {edge}", self.member, out)
            return
        try:
            for page in data:
                run.inbox.add(page)
        except Exception as exc:
            self._failed_at(q, exc, f"pages from {peer}", out)
            return
        self.counters["batches_in"] += len(data)
        if complete:
            run.waiting.discard(peer)
            if not run.waiting:
                self._run_fragment(q, run, run.inbox.table, out)

    def _on_call_result(self, ev: c.CallResult, out: list[c.Action]) -> None:
        qid = self._tags.pop(ev.tag, None)
        q = self.queries.get(qid) if qid is not None else None
        if q is None:
            if ev.tag != x.CLEANUP_TAG:
                self.counters["exchange_results_ignored"] += 1
            return
        fetch = q.sources.pop(ev.tag, None)
        if fetch is not None:
            if ev.error is not None:
                text = f"{q.exchange} exchange from {fetch.peer} failed: {ev.error}"
                self._fail(q, ErrorCode.GENERIC, text, self.member, out)
                return
            complete = bool(ev.result["complete"])
            if not complete:  # pull again: the source answers with the next pages
                q.sources[ev.tag] = fetch
                self._tags[ev.tag] = q.id
            q.step(Step.BATCH)
            self._take_pages(q, fetch.edge, fetch.peer, list(ev.result["pages"]), complete, out)
            if not complete and q.phase is Phase.RUNNING:
                out.append(x.fetch_call(ev.tag, fetch))
            return
        pub = q.publishing.pop(ev.tag, None)
        if pub is None:
            return
        if ev.error is not None:
            text = f"{q.exchange} output buffer {x.task_id(q.id, pub.edge)}/{pub.buffer_id}: {ev.error}"
            self._fail(q, ErrorCode.DATA_EXCEPTION, text, self.member, out)
            return
        self._maybe_complete(q, out)

    def _release_binx(self, q: QueryState, step: Step, out: list[c.Action]) -> None:
        """Stop pulling what is still open; free what we published unless the query completed (then the
        consumer deletes it, or its loss aborts it, see ``_handed``)."""
        for fetch in q.sources.values():
            out.append(x.abandon_call(fetch))
        for tag in [*q.sources, *q.publishing]:
            self._tags.pop(tag, None)
        for peer, pub in q.published:
            if step is Step.COMPLETE:
                handed = self._handed.setdefault(peer, {})
                handed[pub] = None
                if len(handed) > x.MAX_HANDED:
                    del handed[next(iter(handed))]
            else:
                out.append(x.abort_call(pub, f"query {q.id} ended ({step.value})"))
        q.sources.clear()
        q.publishing.clear()
        q.published.clear()
        self._chosen.pop(q.id, None)

    def _abort_handed(self, qid: QueryId, out: list[c.Action]) -> None:
        """Free the buffers of a query that completed here and was then cancelled by its initiator: its
        consumers will not read them. (Under ``http`` a consumer's DELETE does not ride the bus link,
        so it can reach this node before the query's start, delete nothing, and leave the buffer
        published later to nobody.)"""
        for handed in self._handed.values():
            for pub in [p for p in handed if p.query_id == qid]:
                del handed[pub]
                out.append(
                    x.abort_call(pub, f"query {qid} was cancelled after it completed on {self.member}")
                )
