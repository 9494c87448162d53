"""An upsert table keyed by one column of a type Arrow's ``unique`` or ``is_in`` has no kernel for
(decimal32, decimal64, float16, a dictionary), which create_table takes (group-by and join have kernels):
every write to it failed with ArrowNotImplementedError once the one-key path took ``unique`` and ``is_in``,
while the same table keyed by two columns took it. Such a key falls back to the general path."""

from __future__ import annotations

import decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from sparkbus.roles.compute import Finishing
from tests.unit.compute.harness import Cluster, ipc

ONE, TWO = decimal.Decimal("1.00"), decimal.Decimal("2.00")
CASES: list[tuple[str, pa.DataType, Any]] = [
    ("decimal32", pa.decimal32(5, 2), [ONE, TWO, ONE]),
    ("decimal64", pa.decimal64(12, 2), [ONE, TWO, ONE]),
    ("float16", pa.float16(), np.array([1, 2, 1], dtype=np.float16)),
    ("dictionary", pa.dictionary(pa.int32(), pa.string()), ["1.00", "2.00", "1.00"]),
]


@pytest.mark.parametrize(("name", "type_", "keys"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("key", [["k"], ["k", "v"]], ids=["one-key", "two-keys"])
def test_upsert_by_a_key_of_a_type_without_hash_kernels(
    name: str, type_: pa.DataType, keys: Any, key: list[str]
) -> None:
    schema = pa.schema([("k", type_), ("v", pa.int64())])
    c = Cluster(("r1",))
    c.up("r1")
    c.run()
    c.do("create_table", name="u", schema=schema, key=key)
    rows = pa.table({"k": pa.array(keys, type_), "v": [1, 2, 1]}, schema=schema)
    c.do("write", table="u", batch=ipc(rows))  # raises with the replica's or controller's error
    c.do("write", table="u", batch=ipc(rows.slice(0, 1)))  # the same row again: replaced, not added
    cid = c.call("peek", view="u", finishing=Finishing())  # unordered: Arrow sorts no float16
    c.run()
    got = sorted((str(r["k"]), r["v"]) for r in c.rows(cid))
    assert got == ([("1.0", 1), ("2.0", 2)] if name == "float16" else [("1.00", 1), ("2.00", 2)]), got
