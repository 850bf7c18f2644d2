"""PostgreSQL column types as Delta column types, and a change's text as typed values, in Spark SQL.

A change carries each column as the text Debezium wrote (spark_jobs/changes/schema.py); the type comes
from PostgreSQL's catalogue (spark_jobs/model/catalogue.py). `typed` turns the text into a value of the
Delta column's type with `try_*` expressions only, so a value that cannot be stored becomes NULL and
`unreadable` says so: the change is rejected with that reason, never a failed batch, and never a
silently rounded or dropped value (a NUMERIC with more decimals than its column has is refused, as
Spark's cast would round it). `as_text` is the way back, for a row image kept as text (a primary-key
move takes its unchanged-TOAST columns from the old key's row: docs/sinks/delta.md).

| PostgreSQL | Delta |
|---|---|
| int2, int4, int8 | smallint, int, bigint |
| numeric(p,s), p <= 38 | decimal(p,s), exact |
| numeric(p,s) with p > 38, numeric without precision | string, the exact decimal text |
| float4, float8 | float, double |
| bool | boolean |
| timestamptz, timestamp, date | timestamp, timestamp_ntz, date |
| bytea | binary (the text is base64) |
| arrays | array<element type> (the text is a JSON array) |
| json, jsonb, text, varchar, uuid, enums, anything else | string |
"""

from __future__ import annotations

from pyspark.sql import Column as SqlColumn
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs.model.catalogue import Column

_SCALARS: dict[str, DataType] = {
    "INT2": ShortType(), "INT4": IntegerType(), "INT8": LongType(),
    "FLOAT4": FloatType(), "FLOAT8": DoubleType(), "BOOL": BooleanType(),
    "TIMESTAMPTZ": TimestampType(), "TIMESTAMP": TimestampNTZType(), "DATE": DateType(), "BYTEA": BinaryType(),
}
_INTEGRAL_RANK: dict[type[DataType], int] = {ShortType: 1, IntegerType: 2, LongType: 3}


def spark_type(column: Column | None) -> DataType:
    """The Delta type of a catalogue column; a column the catalogue does not know is kept as text."""
    if column is None:
        return StringType()
    if column.is_array:
        return ArrayType(spark_type(column.element))
    if column.type == "NUMERIC":
        precision, scale = column.precision or 0, column.scale or 0
        # Spark decimals stop at 38 digits; unconstrained NUMERIC stays exact as text.
        if 0 < precision <= 38 and 0 <= scale <= precision:
            return DecimalType(precision, scale)
        return StringType()
    return _SCALARS.get(column.type, StringType())


def fits(narrow: DataType, wide: DataType) -> bool:
    """Every value of `narrow` is stored exactly in a `wide` column; these are also the widenings
    Delta applies in place (type widening): short→int→long, float→double, decimal growing on both sides."""
    if narrow == wide:
        return True
    if type(narrow) in _INTEGRAL_RANK and type(wide) in _INTEGRAL_RANK:
        return _INTEGRAL_RANK[type(narrow)] <= _INTEGRAL_RANK[type(wide)]
    if isinstance(narrow, FloatType) and isinstance(wide, DoubleType):
        return True
    if isinstance(narrow, DecimalType) and isinstance(wide, DecimalType):
        return wide.scale >= narrow.scale and wide.precision - wide.scale >= narrow.precision - narrow.scale
    if isinstance(narrow, ArrayType) and isinstance(wide, ArrayType):
        return narrow.elementType == wide.elementType
    return False


def _exact_decimal(text: SqlColumn, dtype: DecimalType) -> SqlColumn:
    """`text` as decimal(p,s) if it has no non-zero digit beyond the scale (Spark's cast would round)
    and fits the precision (else try_cast gives NULL)."""
    value = F.expr(f"try_cast(NULL AS {dtype.simpleString()})")  # a typed NULL
    fraction = F.regexp_extract(text, r"\.([0-9]*)", 1)
    beyond = F.substring(fraction, dtype.scale + 1, 1_000_000)
    exact = beyond.rlike("^0*$")
    return F.when(exact, text.try_cast(dtype)).otherwise(value)


def typed(text: SqlColumn, dtype: DataType) -> SqlColumn:
    """The value of `text` (Debezium's text of one column) as `dtype`; NULL if it cannot be."""
    if isinstance(dtype, StringType):
        return text
    if isinstance(dtype, ArrayType):
        elements = F.from_json(text, "array<string>")
        return F.transform(elements, lambda element: typed(element, dtype.elementType))
    if isinstance(dtype, DecimalType):
        return _exact_decimal(text, dtype)
    if isinstance(dtype, BinaryType):
        return F.try_to_binary(text, F.lit("base64"))
    return text.try_cast(dtype)


def unreadable(text: SqlColumn, value: SqlColumn, dtype: DataType) -> SqlColumn:
    """True where `text` holds a value that `typed` could not make into `dtype` (an array: any element)."""
    if isinstance(dtype, StringType):
        return F.lit(False)
    bad = text.isNotNull() & value.isNull()
    if isinstance(dtype, ArrayType):
        elements = F.from_json(text, "array<string>")
        pairs = F.arrays_zip(elements.alias("t"), value.alias("v"))
        return bad | F.exists(pairs, lambda pair: pair["t"].isNotNull() & pair["v"].isNull())
    return bad


def as_text(value: SqlColumn, dtype: DataType) -> SqlColumn:
    """A stored value back as the text `typed` reads (a row image kept as text)."""
    if isinstance(dtype, StringType):
        return value
    if isinstance(dtype, ArrayType):
        return F.to_json(F.transform(value, lambda element: as_text(element, dtype.elementType)))
    if isinstance(dtype, BinaryType):
        return F.base64(value)
    return value.cast("string")


__all__ = ["as_text", "fits", "spark_type", "typed", "unreadable"]
