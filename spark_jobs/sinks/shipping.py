"""What every shipper on the executors shares: Arrow columns of prebuilt bytes in, rejected rows out.

A sink that has no JVM writer builds its store's requests with Spark SQL, and `mapInArrow` hands each
executor's Python worker Arrow batches of them. These helpers keep that side to bytes and columns:
`joined` concatenates a column's values without a Python object per row (one slice of Arrow's data
buffer), `rejected` returns the rows a store or the sink refused, as the pipeline's dead letters.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# The rows a shipper yields, as Spark is told (mapInArrow's schema): those rejected, with the reason.
REJECTED = "origin struct<topic: string, partition: int, offset: bigint>, error string, letter_value binary"


def joined(values: pa.Array) -> memoryview:
    """The concatenated bytes of a string or binary array's values, without copying (NULLs add nothing)."""
    if len(values) == 0:
        return memoryview(b"")
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=len(values) + 1, offset=values.offset * 4)
    data = values.buffers()[2]
    return memoryview(data)[int(offsets[0]):int(offsets[-1])] if data is not None else memoryview(b"")


def rejected(refused: pa.RecordBatch, rows: pa.RecordBatch, reasons: dict[int, str]) -> pa.RecordBatch:
    """The REJECTED batch: `refused` (rows refused before shipping, with their own `error`), then the
    rows of `rows` the store refused (`reasons` by row index)."""
    indices = pa.array(sorted(reasons), pa.int64())
    origin = pa.concat_arrays([refused.column("origin"), rows.column("origin").take(indices)])
    errors = pa.concat_arrays([refused.column("error").cast(pa.string()),
                               pa.array([reasons[i] for i in sorted(reasons)], pa.string())])
    return pa.RecordBatch.from_arrays([origin, errors, pa.nulls(len(origin), pa.binary())],
                                      names=["origin", "error", "letter_value"])
