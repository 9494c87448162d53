"""Credit streams on the node: batches out on PUSH, batches in from PULL, flow control on the control link."""

from __future__ import annotations

from sparkbus.bus import contract as c
from sparkbus.bus.credit import CreditReceiver, CreditSender
from sparkbus.bus.messages import ErrorCode, FlowControl, StreamBatch
from sparkbus.bus.state import NodeState, _Inbound, _Peer
from sparkbus.codecs import REGISTRY


class StreamLayer(NodeState):
    """Stream state and credit accounting per peer; mixed into ``NodeCore``."""

    def _on_batch(self, peer: str, stream: str, msg: StreamBatch, now: float) -> None:
        st = self._peers[peer]
        role = self.roles.get(stream.partition("/")[0])
        inbound = self._inbound[peer]
        if not st.up:
            self._refuse_early(inbound, StreamBatch, now)
            return
        recv = st.receivers.get(stream)
        if recv is None and stream in st.ended:
            if msg.ordinal > 0 or st.ended[stream] == 0:
                # The rest of a stream this side ended (closed on cancel, or refused): dropped, counted.
                self._counts["dropped_batches_ended_stream"] += 1
                if msg.last:
                    del st.ended[stream]
                else:
                    st.ended[stream] = msg.ordinal + 1
                return
            del st.ended[stream]  # ordinal 0 after the old one's: a new stream under the same key
        if role is None:
            self._refuse_stream(
                inbound, st, stream, msg, ErrorCode.NO_ROLE, f"node {self.node_id} runs no such role", now
            )
            return
        if recv is None:
            if len(st.receivers) >= self.config.max_streams:
                text = f"{self.config.max_streams} open already"
                self._refuse_stream(inbound, st, stream, msg, ErrorCode.TOO_MANY_STREAMS, text, now)
                return
            credit = st.accepted.pop(stream, self.config.initial_credit)
            recv = st.receivers[stream] = CreditReceiver(stream, credit, self.config.low_watermark)
        size = len(msg.data)
        try:
            recv.received(msg.ordinal, size, msg.remaining, msg.last)
        except c.RemoteProtocolError as exc:
            st.receivers.pop(stream, None)
            self._error_to(inbound, ErrorCode.STREAM_VIOLATION, str(exc), REGISTRY.code_of(StreamBatch), now)
            self._link_lost(peer, f"stream violation: {exc}", now)
            return
        self._n_batches_in += 1
        self._n_stream_bytes_in += size
        self._dispatch(
            role,
            c.BatchReceived(
                peer=peer,
                stream=stream,
                ordinal=msg.ordinal,
                last=msg.last,
                data=msg.data,
                size=size,
                remaining=msg.remaining,
            ),
            now,
        )

    def _refuse_stream(
        self,
        inbound: _Inbound,
        st: _Peer,
        stream: str,
        msg: StreamBatch,
        code: ErrorCode,
        text: str,
        now: float,
    ) -> None:
        """Refuse a stream on its first batch: ERROR to the sender, and its other batches dropped."""
        self._error_to(inbound, code, f"stream {stream}: {text}", REGISTRY.code_of(StreamBatch), now)
        if not msg.last:
            self._stream_ended(st, stream, msg.ordinal + 1)

    def _stream_ended(self, st: _Peer, stream: str, next_ordinal: int) -> None:
        """Remember that ``stream`` from this peer ended here before its last batch (see ``_Peer.ended``)."""
        if len(st.ended) >= self.config.max_streams:
            del st.ended[next(iter(st.ended))]  # the oldest: its sender has long stopped, or never will
        st.ended[stream] = next_ordinal

    def _on_flow_control(self, inbound: _Inbound, stream: str | None, msg: FlowControl, now: float) -> None:
        st = self._peers[inbound.peer]
        entry = st.senders.get(stream or "")
        if entry is None:
            self._counts["dropped_flow_control_unknown_stream"] += 1  # the stream ended or was closed
            return
        role_name, sender = entry
        try:
            applied = sender.grant(msg.ordinal, msg.credit, msg.acked, window=self._window(sender))
        except c.RemoteProtocolError as exc:
            self._error_to(inbound, ErrorCode.STREAM_VIOLATION, str(exc), REGISTRY.code_of(FlowControl), now)
            return
        if not applied:
            self._counts["dropped_stale_flow_control"] += 1
            return
        self._n_flow_control_in += 1
        role = self.roles.get(role_name)
        if role is not None:
            self._dispatch(
                role, c.CreditChanged(peer=inbound.peer, stream=sender.stream, credit=sender.credit), now
            )

    def _window(self, sender: CreditSender) -> int:
        """The most a receiver may hold for ``sender``'s stream, so the largest grant it may send.

        The credit agreed when the stream was opened is what an ``AcceptStream`` receiver holds; a receiver
        that was not told accepts the stream with its ``initial_credit``, and the nodes of one cluster share
        their bus settings. A FLOW_CONTROL above this is refused as ``STREAM_VIOLATION``.
        """
        return max(sender.max_credit, self.config.initial_credit)

    def _stream_peer(self, peer: str, stream: str) -> _Peer:
        if peer == self.node_id:
            return self._peers.setdefault(peer, _Peer(up=True))
        st = self._peers.get(peer)
        if st is None or not st.up:
            raise c.LocalProtocolError(f"stream {stream}: peer {peer} is not connected")
        return st

    def _receiver(self, peer: str, stream: str) -> CreditReceiver:
        st = self._peers.get(peer)
        recv = st.receivers.get(stream) if st is not None else None
        if recv is None:
            raise c.LocalProtocolError(f"stream {stream} from {peer} is not open")
        return recv

    def _act_batch(self, role: c.Role, action: c.SendBatch, now: float) -> None:
        st = self._stream_peer(action.peer, action.stream)
        entry = st.senders.get(action.stream)
        if entry is None:
            raise c.LocalProtocolError(
                f"stream {action.stream} to {action.peer} is not open (OpenStream first)"
            )
        sender = entry[1]
        data = action.data
        size = len(data) if type(data) is bytes else _nbytes(action.stream, data)
        ordinal, remaining = sender.spend(size, action.last)
        if action.last:
            del st.senders[action.stream]
        self._n_batches_out += 1
        self._n_stream_bytes_out += size
        batch = StreamBatch(ordinal=ordinal, last=action.last, remaining=remaining, data=action.data)
        if action.peer == self.node_id:
            self._local_batch(action.stream, batch, now)
            return
        inbound = self._inbound[action.peer]
        if inbound.kind == "client":
            self._send_to_peer(action.peer, batch, now, action.stream)
            return
        out = self._outbound[action.peer]
        frames = self.codec.encode(batch, session=out.session, seq=out.data_seq + 1, stream=action.stream)
        out.data_seq += 1  # after the encoding, as on ctl (NodeCore._send_ctl)
        self._emit("data", action.peer, frames)

    def _local_batch(self, stream: str, batch: StreamBatch, now: float) -> None:
        # Loopback streams keep the same credit discipline as remote ones.
        st = self._peers[self.node_id]
        role = self.roles.get(stream.split("/", 1)[0])
        if role is None:
            raise c.LocalProtocolError(f"stream {stream}: node {self.node_id} runs no such role")
        recv = st.receivers.get(stream)
        if recv is None:
            recv = st.receivers[stream] = CreditReceiver(
                stream, st.accepted.pop(stream, self.config.initial_credit), self.config.low_watermark
            )
        recv.received(batch.ordinal, len(batch.data), batch.remaining, batch.last)
        self._local.append(
            (
                role,
                c.BatchReceived(
                    peer=self.node_id,
                    stream=stream,
                    ordinal=batch.ordinal,
                    last=batch.last,
                    data=batch.data,
                    size=len(batch.data),
                    remaining=batch.remaining,
                ),
            )
        )

    def _act_consumed(self, action: c.Consumed, now: float) -> None:
        st = self._peers.get(action.peer)
        recv = st.receivers.get(action.stream) if st is not None else None
        if recv is None:
            return  # the stream ended (last batch, or the peer was lost): nothing left to grant
        recv.consumed(action.size)
        if recv.done and recv.local == recv.max_credit:
            if action.stream not in st.senders:  # type: ignore[union-attr]
                # (With an outgoing stream under the same key, the role's CloseStream removes it, so
                # that the close is not taken for the outgoing one.)
                del st.receivers[action.stream]  # type: ignore[union-attr]
            return
        grant = recv.take_grant()
        if grant is not None:
            self._send_flow_control(action.peer, action.stream, *grant, now)

    def _send_flow_control(
        self, peer: str, stream: str, ordinal: int, credit: int, acked: int, now: float
    ) -> None:
        fc = FlowControl(ordinal=ordinal, credit=credit, acked=acked)
        self._n_flow_control_out += 1
        if peer == self.node_id:
            entry = self._peers[peer].senders.get(stream)
            if entry is not None and entry[1].grant(ordinal, credit, acked, window=self._window(entry[1])):
                role = self.roles.get(entry[0])
                if role is not None:
                    self._local.append(
                        (role, c.CreditChanged(peer=peer, stream=stream, credit=entry[1].credit))
                    )
            return
        if self.is_up(peer):
            self._send_to_peer(peer, fc, now, stream)


def _nbytes(stream: str, data: object) -> int:
    """The bytes of a batch given as a buffer other than ``bytes`` (a memoryview counts bytes, not items).

    Raises:
        LocalProtocolError: ``data`` is not a buffer (a str, a list): checked before any credit is spent,
            so the stream goes on as if the batch had not been tried.
    """
    try:
        return memoryview(data).nbytes  # type: ignore[arg-type]
    except TypeError:
        raise c.LocalProtocolError(
            f"stream {stream}: batch data must be bytes-like, not {type(data).__name__}"
        ) from None
