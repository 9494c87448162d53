"""BinX PDUs: round trips through the envelope, strict decoding, constructor rules."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkbus.codecs import DecodeError, EnvelopeCodec
from sparkbus.roles.exchange import (
    BinReply,
    BinRequest,
    ErrorCode,
    ReplyStatus,
    RequestType,
    check_buffer_key,
    pack_sizes,
    page_sizes_of,
    unpack_sizes,
)
from sparkbus.roles.exchange.messages import MAX_REMAINING_ENTRIES, U64_MAX

codec = EnvelopeCodec()


def data_request(**kw: object) -> BinRequest:
    fields: dict[str, object] = {
        "sequence": 1,
        "requestType": RequestType.DATA,
        "getDataSize": False,
        "maxSizeOctets": 1024,
        "maxWaitMicroSeconds": 2_000_000,
        "taskId": "q1.0.0.0",
        "bufferId": 3,
        "pageToken": 7,
    }
    fields.update(kw)
    return BinRequest(**fields)  # type: ignore[arg-type]


def reply(**kw: object) -> BinReply:
    fields: dict[str, object] = {
        "sequence": 1,
        "replyType": RequestType.DATA,
        "status": ReplyStatus.OK,
        "bufferComplete": False,
        "pageToken": 7,
        "pageNextToken": 9,
        "remainingBytes": pack_sizes((5,)),
        "pageSizes": pack_sizes((3, 2)),
        "instanceId": "i1",
        "data": b"abcde",
    }
    fields.update(kw)
    return BinReply(**fields)  # type: ignore[arg-type]


def test_request_body_uses_the_rfc_field_names() -> None:
    frames = codec.encode(data_request())
    assert len(frames) == 2
    body = msgpack.unpackb(frames[1])
    assert set(body) == {
        "sequence",
        "requestType",
        "getDataSize",
        "maxSizeOctets",
        "maxWaitMicroSeconds",
        "taskId",
        "bufferId",
        "pageToken",
    }
    assert msgpack.unpackb(frames[0])[1] == 0x0200


def test_reply_pages_travel_as_one_blob_frame() -> None:
    frames = codec.encode(reply())
    assert len(frames) == 3 and frames[2] == b"abcde"
    decoded = codec.decode(frames).message
    assert decoded == reply()
    assert [bytes(p) for p in decoded.pages()] == [b"abc", b"de"]
    assert msgpack.unpackb(frames[0])[1] == 0x0201


def test_coded_fields_and_sizes_are_plain_on_the_wire() -> None:
    body = msgpack.unpackb(codec.encode(reply(pageSizes=pack_sizes((3, 2))))[1])
    # pageSizes is one msgpack bin of little-endian u64s, like remainingBytes; the codes are plain uints
    assert body["pageSizes"] == bytes([3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0])
    assert (body["replyType"], body["status"], body["errorCode"]) == (0, 0, 0)
    decoded = codec.decode(codec.encode(reply())).message
    assert type(decoded.status) is int and decoded.status == ReplyStatus.OK
    assert decoded.replyType == RequestType.DATA and decoded.errorCode == ErrorCode.NONE


def test_one_page_sizes_are_packed_like_any_other() -> None:
    assert page_sizes_of([b"abc"]) == pack_sizes((3,))
    assert page_sizes_of([b"abc", b"", b"de"]) == pack_sizes((3, 0, 2))


def test_reply_decodes_zero_copy() -> None:
    frames = codec.encode(reply())
    view = [frames[0], frames[1], memoryview(frames[2])]
    decoded = codec.decode(view, copy_blobs=False).message
    assert [bytes(p) for p in decoded.pages()] == [b"abc", b"de"]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"sequence": -1}, "sequence"),
        ({"pageToken": U64_MAX + 1}, "pageToken"),
        ({"taskId": ""}, "taskId"),
        ({"maxSizeOctets": 0}, "maxSizeOctets"),
        ({"requestType": RequestType.ACK}, "getDataSize"),
        ({"requestType": 3}, "requestType"),
        ({"requestType": RequestType.DELETE, "maxSizeOctets": 0, "maxWaitMicroSeconds": 5}, "getDataSize"),
    ],
)
def test_bad_requests_are_refused_on_construction_and_decode(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        data_request(**kw)
    if kw.get("pageToken") == U64_MAX + 1:
        return  # msgpack itself cannot carry it
    body = msgpack.unpackb(codec.encode(data_request())[1])
    body.update({k: int(v) if isinstance(v, int) else v for k, v in kw.items()})
    header = codec.encode(data_request())[0]
    with pytest.raises(DecodeError) as err:
        codec.decode([header, msgpack.packb(body)])
    assert err.value.message_type == "BinRequest"


@pytest.mark.parametrize("task_id", ["\ud800", "q1.\udcff.0.0", "q1.é.\udfff"])
def test_a_task_id_without_a_utf8_form_is_refused_on_construction(task_id: str) -> None:
    """A msgpack str is UTF-8: a request built with a lone surrogate would fail in the node's encoder on
    every send (and its fetch never be answered), so it is refused where it is built, as the client's check
    (``check_buffer_key``) refuses it before a source opens."""
    with pytest.raises(ValueError, match="taskId must be UTF-8 text, got a lone surrogate"):
        data_request(taskId=task_id)
    with pytest.raises(ValueError, match=r"^task_id must be UTF-8 text"):
        check_buffer_key(task_id, 0)


def test_a_task_id_of_any_utf8_text_is_carried() -> None:
    for task_id in ("q1.é.0.0", "задача.1", "\U0001f600" * 1024):
        check_buffer_key(task_id, 0)
        assert codec.decode(codec.encode(data_request(taskId=task_id))).message.taskId == task_id


def test_size_probe_needs_no_max_size() -> None:
    probe = data_request(getDataSize=True, maxSizeOctets=0)
    assert codec.decode(codec.encode(probe)).message == probe


@pytest.mark.parametrize(
    ("kw", "text"),
    [
        ({"pageNextToken": 6, "pageSizes": b"", "data": b""}, "below pageToken"),
        ({"pageSizes": pack_sizes((3,))}, "pageSizes lists 1"),
        ({"pageSizes": pack_sizes((3, 3))}, "sum to len"),
        ({"pageSizes": b"\x03\x00"}, "packed u64"),
        ({"replyType": 3}, "replyType must be one of"),
        ({"status": 4}, "status must be one of"),
        ({"status": ReplyStatus.SERVER_ERROR, "errorCode": 7}, "errorCode must be one of"),
        ({"remainingBytes": pack_sizes((1,) * (MAX_REMAINING_ENTRIES + 1))}, "remainingBytes"),
        ({"remainingBytes": b"\x01\x00\x00"}, "remainingBytes"),
        ({"status": ReplyStatus.SERVER_ERROR}, "errorCode"),
        ({"errorCode": ErrorCode.ABORTED}, "errorCode"),
        ({"status": ReplyStatus.NODATA}, "must be OK"),
        ({"replyType": RequestType.ACK}, "must be empty"),
    ],
)
def test_inconsistent_replies_are_refused(kw: dict[str, object], text: str) -> None:
    with pytest.raises(ValueError, match=text):
        reply(**kw)


def test_wrong_field_type_is_named() -> None:
    frames = codec.encode(reply())
    body = msgpack.unpackb(frames[1])
    body["status"] = 9
    with pytest.raises(DecodeError) as err:
        codec.decode([frames[0], msgpack.packb(body), frames[2]])
    assert err.value.field == "status"
    body["status"] = 0
    del body["pageSizes"]
    with pytest.raises(DecodeError) as err:
        codec.decode([frames[0], msgpack.packb(body), frames[2]])
    assert err.value.field == "pageSizes"


def test_missing_blob_frame_is_refused() -> None:
    frames = codec.encode(reply())
    with pytest.raises(DecodeError, match="frames"):
        codec.decode(frames[:2])


@given(
    pages=st.lists(st.binary(max_size=50), max_size=8),
    token=st.integers(0, U64_MAX - 8),
    complete=st.booleans(),
    remaining=st.lists(st.integers(0, U64_MAX), max_size=5),
)
def test_reply_round_trip(pages: list[bytes], token: int, complete: bool, remaining: list[int]) -> None:
    msg = BinReply(
        sequence=token,
        replyType=RequestType.DATA,
        status=ReplyStatus.OK if pages else ReplyStatus.NODATA,
        bufferComplete=complete,
        pageToken=token,
        pageNextToken=token + len(pages),
        remainingBytes=pack_sizes(remaining),
        pageSizes=pack_sizes(len(p) for p in pages),
        instanceId="x",
        data=b"".join(pages),
    )
    back = codec.decode(codec.encode(msg)).message
    assert back == msg
    assert [bytes(p) for p in back.pages()] == pages
    assert back.page_sizes() == tuple(map(len, pages)) and back.page_count == len(pages)
    assert back.remaining() == tuple(remaining)


def test_remaining_bytes_are_packed_little_endian_u64s() -> None:
    assert pack_sizes((1, 256)) == bytes([1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0])
    assert unpack_sizes(pack_sizes((0, U64_MAX))) == (0, U64_MAX)
    for bad in ((-1,), (U64_MAX + 1,)):
        with pytest.raises(ValueError, match="u64"):
            pack_sizes(bad)
    body = msgpack.unpackb(codec.encode(reply())[1])
    assert body["remainingBytes"] == bytes([5, 0, 0, 0, 0, 0, 0, 0])
