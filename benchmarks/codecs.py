"""Codec throughput: Arrow IPC (raw and zstd) against msgpack rows, the naive baseline.

A realistic batch: int64 key, int64 id, float64 value, a short string. Each figure is one encode plus
one decode of the whole batch through sparkbus.codecs (decode includes full validation, as for a peer's
bytes). MB/s counts the uncompressed Arrow IPC size for every codec, so the figures compare directly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, parser, table, timed, write

from sparkbus.codecs import Compression, decode_batch, encode_batch


def make_batch(rows: int) -> pa.RecordBatch:
    ids = pa.array(range(rows), pa.int64())
    noise = pc.random(rows, initializer=7)
    kinds = pa.array(["click", "view", "buy", "scroll", "share"])
    return pa.RecordBatch.from_pydict(
        {
            "key": pc.cast(pc.floor(pc.multiply(noise, 10_000)), pa.int64()),
            "id": ids,
            "value": pc.multiply(pc.random(rows, initializer=8), 100.0),
            "name": pc.take(kinds, pc.bit_wise_and(ids, 3)),
        }
    )


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    rows = 100_000 if args.quick else 1_000_000
    repeats = 2 if args.quick else 5
    batch = make_batch(rows)
    ipc = encode_batch(batch)
    ipc_bytes = len(ipc)

    def arrow_ipc() -> None:
        decode_batch(encode_batch(batch))

    def arrow_zstd(level: int) -> tuple[object, list[int]]:
        comp = Compression(level=level, min_size=0, max_decompressed=1 << 31)
        sizes: list[int] = []

        def run() -> None:
            packed, _ = comp.compress(encode_batch(batch))
            sizes.append(len(packed))
            decode_batch(comp.decompress(packed))

        return run, sizes

    def msgpack_rows() -> None:
        # What a naive implementation does: rows as msgpack arrays (conversion to rows included).
        data = msgpack.packb([list(r) for r in zip(*batch.to_pydict().values(), strict=True)])
        msgpack.unpackb(data)

    z1, z1_sizes = arrow_zstd(1)
    z3, z3_sizes = arrow_zstd(3)
    results = {}
    for name, fn in [
        ("arrow_ipc", arrow_ipc),
        ("arrow_ipc_zstd1", z1),
        ("arrow_ipc_zstd3", z3),
        ("msgpack_rows", msgpack_rows),
    ]:
        t = median(timed(fn, repeats))  # type: ignore[arg-type]
        results[name] = {"seconds": t, "mb_s": ipc_bytes / t / 1e6, "rows_s": rows / t}
    figures = {
        "rows": rows,
        "ipc_bytes": ipc_bytes,
        "arrow_ipc_mb_s": results["arrow_ipc"]["mb_s"],
        "arrow_ipc_rows_s": results["arrow_ipc"]["rows_s"],
        "arrow_ipc_zstd1_mb_s": results["arrow_ipc_zstd1"]["mb_s"],
        "arrow_ipc_zstd1_rows_s": results["arrow_ipc_zstd1"]["rows_s"],
        "arrow_ipc_zstd3_mb_s": results["arrow_ipc_zstd3"]["mb_s"],
        "arrow_ipc_zstd3_rows_s": results["arrow_ipc_zstd3"]["rows_s"],
        "msgpack_rows_mb_s": results["msgpack_rows"]["mb_s"],
        "msgpack_rows_rows_s": results["msgpack_rows"]["rows_s"],
        "zstd1_ratio": ipc_bytes / z1_sizes[-1],
        "zstd3_ratio": ipc_bytes / z3_sizes[-1],
        "arrow_ipc_vs_msgpack_rows": results["arrow_ipc"]["mb_s"] / results["msgpack_rows"]["mb_s"],
    }
    write(args.out, "codecs", figures, args.quick)
    print(f"{rows:,} rows, {ipc_bytes / 1e6:.1f} MB as Arrow IPC; encode + decode, median of {repeats}")
    print(
        table(
            [(n, f"{r['mb_s']:.0f}", f"{r['rows_s'] / 1e6:.2f}") for n, r in results.items()],
            ("codec", "MB/s", "M rows/s"),
        )
    )
    print(f"zstd ratio: level 1 {figures['zstd1_ratio']:.2f}, level 3 {figures['zstd3_ratio']:.2f}")


if __name__ == "__main__":
    main()
