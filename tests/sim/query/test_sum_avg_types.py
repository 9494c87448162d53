"""Seeded simulations: SUM and AVG of a BOOLEAN are refused with ``DATA_EXCEPTION`` by the participants that
read the rows, also with repartition, as Spark SQL refuses them
(DATATYPE_MISMATCH.UNEXPECTED_INPUT_TYPE); MIN and MAX of a BOOLEAN are answered."""

from __future__ import annotations

import pyarrow as pa
import pytest

from .cluster import Cluster

B = [True, False, None, True, True, False]


def _cluster(seed: int) -> Cluster:
    c = Cluster(seed, rows=8)
    for node, part in (("p1", B[:3]), ("p2", B[3:])):
        c.load(node, pa.table({"g": pa.array([1, 2, 1], pa.int64()), "b": pa.array(part)}), name="f")
    return c


@pytest.mark.parametrize("seed", [1, 2])
def test_sum_or_avg_of_a_boolean_is_refused(seed: int) -> None:
    c = _cluster(seed)
    for text in (
        "SELECT sum(b) AS s FROM f",
        "SELECT avg(b) AS a FROM f",
        "SELECT g, sum(b) AS s FROM f GROUP BY g",
    ):
        for repartition in (False, True):
            got, err = c.outcome(c.execute(text, repartition=repartition))
            assert got is None and err is not None, text
            assert (
                err.startswith("[2000 DATA_EXCEPTION] ") and "takes numbers" in err and "not bool" in err
            ), err
    got, err = c.outcome(c.execute("SELECT min(b) AS lo, max(b) AS hi, count(b) AS n FROM f"))
    assert err is None and got is not None and got.to_pylist() == [{"lo": False, "hi": True, "n": 5}], err
    c.settle()
    assert not any(c.leaks().values())
