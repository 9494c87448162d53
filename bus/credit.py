"""Credit accounting for one stream, without I/O (like h2's WindowManager).

Credits are bytes (Mustang 3.4.2; zguide chapter 7). The receiver *sets* the sender's credit with flow
control that carries an ordinal; the sender applies only ordinals newer than the last it applied, so a
reordered, stale grant can never inflate the window. Nor can a grant exceed the stream's window, the most
the receiver will ever hold for it: an honest receiver never grants more than it has free, so a larger
grant (fuzzing sent 2**64 - 1) is a peer breaking the rules and is refused.

Each grant also names the last batch the receiver had seen (``acked``). The sender subtracts the bytes it
sent after that batch, which were in flight when the grant was made. So the bytes a receiver may have to
hold for a stream never exceed what it granted: memory per stream is bounded by its credit exactly.
(Mustang sets the credit to the receiver's free memory and ignores bytes in flight; it counts rows times an
estimated width, so its bound was approximate anyway.)

The grant policy is Mustang's 40 % low watermark, applied to the sender's credit as the receiver reckons it
(``CreditReceiver.remote``). Before the receiver's first grant that is the ``remaining`` the latest batch
reported. After it, it is the latest grant less the bytes that arrived since: the grant in flight is
counted as applied. A batch's ``remaining`` cannot say more, since the batches sent before the sender
applied a grant carry the older, lower credit; taken at its word, each of them looked like a sender at or
below the mark, and from the first grant on the receiver granted once per batch. The reckoning is exact
when nothing is in flight (the sender then has applied every grant and the receiver has every batch), so a
sender out of credit is always granted again once the receiver has room.
"""

from __future__ import annotations

from collections import deque

from sparkbus.bus.contract import LocalProtocolError, RemoteProtocolError


class CreditSender:
    """The sending side of a stream: bytes it may still put in flight."""

    __slots__ = (
        "closed",
        "credit",
        "in_flight",
        "in_flight_bytes",
        "last_grant",
        "max_credit",
        "next_ordinal",
        "stream",
    )

    def __init__(self, stream: str, credit: int) -> None:
        if credit < 0:
            raise LocalProtocolError(f"stream {stream}: initial credit must be >= 0, got {credit}")
        self.stream = stream
        self.credit = credit
        self.max_credit = credit  # the window agreed when the stream was opened
        self.next_ordinal = 0
        self.last_grant = -1
        self.closed = False
        self.in_flight: deque[tuple[int, int]] = deque()
        self.in_flight_bytes = 0  # the sum of the sizes in ``in_flight``

    def spend(self, size: int, last: bool) -> tuple[int, int]:
        """Account for a batch of ``size`` bytes; returns ``(ordinal, remaining credit)``.

        Raises:
            LocalProtocolError: the batch exceeds the credit, the stream is closed, or it is an empty
                batch that is not the last.
        """
        if self.closed:
            raise LocalProtocolError(f"stream {self.stream}: batch after the last one")
        if size == 0 and not last:
            raise LocalProtocolError(f"stream {self.stream}: an empty batch must be the last")
        if size > self.credit:
            raise LocalProtocolError(
                f"stream {self.stream}: batch of {size} bytes exceeds credit {self.credit}"
            )
        self.credit -= size
        ordinal = self.next_ordinal
        self.next_ordinal += 1
        self.closed = last
        self.in_flight.append((ordinal, size))
        self.in_flight_bytes += size
        return ordinal, self.credit

    def grant(self, ordinal: int, credit: int, acked: int, *, window: int | None = None) -> bool:
        """Apply flow control; returns False (and changes nothing) for a stale or repeated ordinal.

        Args:
            ordinal, credit, acked: the FLOW_CONTROL's fields.
            window: the most the receiver may hold for the stream; default the initial credit. (A receiver
                that was not told the credit out of band uses its node's default, which may be larger.)

        Raises:
            RemoteProtocolError: a negative credit, a credit larger than the window, or an ``acked`` batch
                that was never sent. Nothing changes.
        """
        limit = self.max_credit if window is None else max(window, self.max_credit)
        if credit < 0:
            raise RemoteProtocolError(f"stream {self.stream}: negative credit {credit} in flow control")
        if credit > limit:
            raise RemoteProtocolError(
                f"stream {self.stream}: flow control grants {credit} bytes, more than the stream's window "
                f"of {limit}"
            )
        if acked >= self.next_ordinal:
            raise RemoteProtocolError(f"stream {self.stream}: flow control acks batch {acked}, never sent")
        if ordinal <= self.last_grant:
            return False
        self.last_grant = ordinal
        in_flight = self.in_flight
        while in_flight and in_flight[0][0] <= acked:
            self.in_flight_bytes -= in_flight.popleft()[1]
        self.credit = max(0, credit - self.in_flight_bytes)
        return True


def check_receiver_credit(stream: str, credit: object) -> None:
    """Raise ``LocalProtocolError`` unless ``credit`` can be what a receiver holds for ``stream`` (an int > 0)."""
    if type(credit) is not int or credit <= 0:
        raise LocalProtocolError(f"stream {stream}: credit must be a positive int, got {credit!r}")


class CreditReceiver:
    """The receiving side of a stream, with Mustang's grant policy (``SimpleFlowControl``).

    ``local`` is the memory the receiver still has free for the stream, ``remote`` the sender's credit as
    the receiver reckons it: the ``remaining`` of the latest batch until the first grant, then the latest
    grant less the bytes received since (see the module's docstring). When the sender is low
    (``remote/max <= lwm``) and the receiver has room (``local/max > lwm``), the receiver grants ``local``.
    From one grant to the next at least ``local - lwm*max`` bytes arrive, so a receiver that consumes what
    it receives at once grants about once per ``(1 - lwm)`` of the window.
    """

    __slots__ = (
        "done",
        "expected_ordinal",
        "local",
        "lwm",
        "max_credit",
        "next_grant",
        "pending",
        "remote",
        "stream",
    )

    def __init__(self, stream: str, max_credit: int, lwm: float = 0.4) -> None:
        check_receiver_credit(stream, max_credit)
        self.stream = stream
        self.max_credit = max_credit
        self.lwm = lwm
        self.local = max_credit
        self.remote = max_credit
        self.expected_ordinal = 0
        self.next_grant = 0
        self.pending = False
        self.done = False

    @property
    def acked(self) -> int:
        """The ordinal of the last batch received (-1 before the first)."""
        return self.expected_ordinal - 1

    def received(self, ordinal: int, size: int, remaining: int, last: bool) -> None:
        """Account for an arriving batch.

        Raises:
            RemoteProtocolError: the sender broke the rules: wrong ordinal, a batch after the last one,
                an empty batch that is not the last, more bytes than it had credit for, or a remaining
                credit larger than the stream's.
        """
        if self.done:
            raise RemoteProtocolError(f"stream {self.stream}: batch {ordinal} after the last one")
        if ordinal != self.expected_ordinal:
            raise RemoteProtocolError(
                f"stream {self.stream}: batch ordinal {ordinal}, expected {self.expected_ordinal}"
            )
        if size == 0 and not last:
            raise RemoteProtocolError(f"stream {self.stream}: empty batch {ordinal} that is not the last")
        if size > self.local:
            raise RemoteProtocolError(
                f"stream {self.stream}: batch of {size} bytes exceeds the {self.local} granted"
            )
        if remaining < 0 or remaining > self.max_credit:
            raise RemoteProtocolError(f"stream {self.stream}: remaining credit {remaining} out of range")
        self.expected_ordinal += 1
        self.local -= size
        # Every batch after a grant was received after the grant was made (its ``acked`` was the last one
        # received then), so it counts against the grant whether or not the sender had applied it.
        self.remote = remaining if self.next_grant == 0 else max(0, self.remote - size)
        self.done = last

    def consumed(self, size: int) -> None:
        """``size`` bytes were processed and freed."""
        if size < 0 or self.local + size > self.max_credit:
            raise LocalProtocolError(
                f"stream {self.stream}: consumed {size} bytes, but only {self.max_credit - self.local} are held"
            )
        self.local += size
        if (
            not self.done
            and self.remote / self.max_credit <= self.lwm
            and self.local / self.max_credit > self.lwm
        ):
            self.pending = True

    def take_grant(self) -> tuple[int, int, int] | None:
        """The flow control the policy calls for now, as ``(ordinal, credit, acked)``, or None."""
        if not self.pending:
            return None
        self.pending = False
        return self.grant(self.local)

    def grant(self, credit: int) -> tuple[int, int, int]:
        """Set the sender's credit to ``credit`` bytes (at most what is free here): ``(ordinal, credit, acked)``."""
        if credit < 0 or credit > self.local:
            raise LocalProtocolError(
                f"stream {self.stream}: grant {credit} out of range 0..{self.local} (free)"
            )
        ordinal = self.next_grant
        self.next_grant += 1
        self.remote = credit
        return ordinal, credit, self.acked
