"""A realistic, reproducible workload on the demo schema: one transaction per operation.

Customers sign up and get renamed; orders are placed with items, paid, shipped
or cancelled; items are edited, renumbered (a primary-key change) and removed;
products get price changes (their TOASTed description untouched) and large
description edits; unreferenced rows are deleted. The same seed gives the same
sequence of operations against the same starting data.

Built to offer PostgreSQL's own ceiling (docs/benchmarks.md, The load generator):
a row is picked by key, never by sorting the table: the first live key at or after
a random point of the key range (two index lookups for the range, one for the row,
done inside the statement that changes the row, so the range is always current).
Every operation is one statement (place order: two, pipelined), prepared on each
connection, and the random draws come from the caller's generator, not PostgreSQL's.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from decimal import Decimal

import psycopg

Operation = Callable[[psycopg.Connection, random.Random], str | None]

# Customers with an email at this domain are probes (services/bench/probes.py): never deleted here.
PROBE_DOMAIN = "probe.tideline"

# Deleting an unreferenced row looks at most this many rows past a random point (then at the first
# ones): bounded work however rare such rows are in a region of the table.
UNUSED_WINDOW = 100


def pick_sql(table: str, columns: str = "id", key: str = "id", where: str = "") -> str:
    """A subquery giving `columns` of one live row of `table`, chosen by key.

    It takes the first row (in `columns` order) whose `key` is at or after min + %(at)s ×
    (max − min + 1), a random point of the live key range (0 ≤ at < 1): min and max are index
    endpoints and the row is one more index step, so the cost does not grow with the table.
    Rows after a gap in the keys are picked a little more often; that is the price of not
    sorting the table. With `where` (which an index must serve, e.g. orders (status, id)), the
    first matching row at or after the point, else the first matching row of the table.
    """
    at = f"(SELECT min({key}) + floor(%(at)s * (max({key}) - min({key}) + 1))::bigint FROM {table})"
    if not where:
        return f"(SELECT {columns} FROM {table} WHERE {key} >= {at} ORDER BY {columns} LIMIT 1)"
    after_point = f"SELECT {columns} FROM {table} WHERE {where} AND {key} >= {at} ORDER BY {columns} LIMIT 1"
    from_start = f"SELECT {columns} FROM {table} WHERE {where} ORDER BY {columns} LIMIT 1"
    return f"(SELECT {columns} FROM (({after_point}) UNION ALL ({from_start})) picked LIMIT 1)"


def unused_sql(table: str, unused: str) -> str:
    """A subquery giving the id of a row of `table` that nothing references (`unused`, a condition
    on alias t): the first such row among UNUSED_WINDOW rows at or after a random point, else among
    the first UNUSED_WINDOW rows; none if neither holds one (then there is nothing to do)."""
    at = f"(SELECT min(id) + floor(%(at)s * (max(id) - min(id) + 1))::bigint FROM {table})"
    # The window is cut before the condition is applied, so PostgreSQL checks UNUSED_WINDOW rows
    # one index probe each instead of hashing the whole referencing table.
    window = "SELECT t.id FROM (SELECT * FROM {table} WHERE id >= {start} ORDER BY id LIMIT {rows}) t " \
             "WHERE {unused} LIMIT 1"
    after_point, from_start = (window.format(unused=unused, table=table, start=start, rows=UNUSED_WINDOW)
                               for start in (at, f"(SELECT min(id) FROM {table})"))
    return f"(SELECT id FROM (({after_point}) UNION ALL ({from_start})) w LIMIT 1)"


def description(rnd: random.Random) -> str:
    """1.6-22 KB of incompressible text (hex of random bytes): stored out of line (TOASTed)."""
    return rnd.randbytes(16 * rnd.randint(50, 700)).hex()


def _changed(conn: psycopg.Connection, sql: str, params: dict, name: str) -> str | None:
    """Run one prepared statement; `name` if it changed a row, None if it found nothing to do."""
    return name if conn.execute(sql, params, prepare=True).rowcount else None


NEW_CUSTOMER = """
INSERT INTO customers (email, name, country) VALUES (%(email)s, %(name)s, %(country)s)
ON CONFLICT (email) DO NOTHING
"""  # a seed replayed against the same database repeats emails: a duplicate sign-up is skipped


def new_customer(conn: psycopg.Connection, rnd: random.Random) -> str:
    name = "".join(rnd.choices(string.ascii_lowercase, k=8)).title()
    conn.execute(NEW_CUSTOMER, {"email": f"{name.lower()}.{rnd.getrandbits(40):x}@example.com", "name": name,
                                "country": rnd.choice(["GB", "FR", "DE", "US", "JP"])}, prepare=True)
    return "new customer"


RENAME_CUSTOMER = f"UPDATE customers SET name = %(name)s, updated_at = now() WHERE id = {pick_sql('customers')}"


def rename_customer(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    return _changed(conn, RENAME_CUSTOMER, {"name": f"Renamed {rnd.getrandbits(24)}", "at": rnd.random()},
                    "rename customer")


NEW_PRODUCT = """
INSERT INTO products (sku, name, description, price, tags, attributes)
VALUES (%(sku)s, %(name)s, %(description)s, %(price)s, %(tags)s, %(attributes)s)
ON CONFLICT (sku) DO NOTHING
"""


def new_product(conn: psycopg.Connection, rnd: random.Random) -> str:
    conn.execute(NEW_PRODUCT, {
        "sku": f"SKU-{rnd.getrandbits(48):012x}",
        "name": f"Product {rnd.getrandbits(16)}",
        "description": description(rnd),
        "price": Decimal(rnd.randint(100, 99_999)) / 100,
        "tags": rnd.sample(["new", "sale", "eco", "gift", "bulk"], k=2),
        "attributes": json.dumps({"weight_g": rnd.randint(10, 5000), "dims": {"h": rnd.randint(1, 50)}}),
    }, prepare=True)
    return "new product"


REPRICE_PRODUCT = f"UPDATE products SET price = %(price)s, updated_at = now() WHERE id = {pick_sql('products')}"


def reprice_product(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    """Leaves the TOASTed description unchanged, so Debezium sends its placeholder."""
    return _changed(conn, REPRICE_PRODUCT, {"price": Decimal(rnd.randint(100, 99_999)) / 100, "at": rnd.random()},
                    "reprice product")


EDIT_DESCRIPTION = (
    f"UPDATE products SET description = %(description)s, updated_at = now() WHERE id = {pick_sql('products')}"
)


def edit_description(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    return _changed(conn, EDIT_DESCRIPTION, {"description": description(rnd), "at": rnd.random()}, "edit description")


# The order and its items in one statement (items priced from their products), then its total: the
# total's update is a second change to a row created in the same transaction, as shops do it.
PLACE_ORDER = f"""
WITH placed AS (
    INSERT INTO orders (customer_id, status, total)
    SELECT c.id, 'pending', 0 FROM {pick_sql('customers')} c
    RETURNING id
), items AS (
    INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price)
    SELECT placed.id, line.n, p.id, line.quantity, p.price
    FROM placed,
         unnest(%(points)s::float8[], %(quantities)s::int[]) WITH ORDINALITY AS line(point, quantity, n),
         LATERAL (SELECT id, price FROM products
                  WHERE id >= (SELECT min(id) + floor(line.point * (max(id) - min(id) + 1))::bigint FROM products)
                  ORDER BY id LIMIT 1) p
    RETURNING order_id
)
SELECT id FROM placed WHERE EXISTS (SELECT 1 FROM items)
"""
ORDER_TOTAL = """
UPDATE orders SET total = (SELECT sum(quantity * unit_price) FROM order_items WHERE order_id = %(order)s)
WHERE id = %(order)s
"""


def place_order(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    lines = rnd.randint(1, 3)
    params = {"at": rnd.random(), "points": [rnd.random() for _ in range(lines)],
              "quantities": [rnd.randint(1, 5) for _ in range(lines)]}
    with conn.transaction() as transaction:
        placed = conn.execute(PLACE_ORDER, params, prepare=True).fetchone()
        if placed is None:  # no customer or no product yet
            raise psycopg.Rollback(transaction)
        conn.execute(ORDER_TOTAL, {"order": placed[0]}, prepare=True)
    return "place order" if placed else None


# Pay (or cancel) a pending order, or ship a paid one: the order desk works by status, through the
# orders (status, id) index (migration 0004).
ADVANCE_ORDER = f"""
UPDATE orders SET status = CASE status WHEN 'pending' THEN %(next)s::order_status ELSE 'shipped' END,
                  updated_at = now()
WHERE id = {pick_sql('orders', where="status = %(status)s::order_status")}
"""


def advance_order(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    return _changed(conn, ADVANCE_ORDER, {"status": rnd.choice(["pending", "pending", "paid"]),
                                          "next": rnd.choice(["paid", "paid", "cancelled"]), "at": rnd.random()},
                    "advance order")


ITEM = pick_sql("order_items", "order_id, line_no", key="order_id")

EDIT_ITEM = f"UPDATE order_items SET quantity = %(quantity)s WHERE (order_id, line_no) = {ITEM}"


def edit_item(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    return _changed(conn, EDIT_ITEM, {"quantity": rnd.randint(1, 9), "at": rnd.random()}, "edit item")


RENUMBER_ITEM = f"""
WITH item AS {ITEM}
UPDATE order_items i SET line_no = (SELECT max(line_no) + 1 FROM order_items WHERE order_id = item.order_id)
FROM item WHERE (i.order_id, i.line_no) = (item.order_id, item.line_no)
"""


def renumber_item(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    """A primary-key change: Debezium emits delete + tombstone + create."""
    return _changed(conn, RENUMBER_ITEM, {"at": rnd.random()}, "renumber item")


REMOVE_ITEM = f"DELETE FROM order_items WHERE (order_id, line_no) = {ITEM}"


def remove_item(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    return _changed(conn, REMOVE_ITEM, {"at": rnd.random()}, "remove item")


# Items and their order in one statement: the foreign key is checked at its end, when both are gone.
DELETE_ORDER = f"""
WITH cancelled AS {pick_sql('orders', where="status = 'cancelled'")},
     items AS (DELETE FROM order_items WHERE order_id IN (SELECT id FROM cancelled))
DELETE FROM orders WHERE id IN (SELECT id FROM cancelled)
"""


def delete_order(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    return _changed(conn, DELETE_ORDER, {"at": rnd.random()}, "delete order")


# Probe rows (the benchmark's freshness markers) must stay until they are read back from every view.
UNUSED = {
    "customers": f"NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = t.id) "
                 f"AND t.email NOT LIKE '%%@{PROBE_DOMAIN}'",
    "products": "NOT EXISTS (SELECT 1 FROM order_items i WHERE i.product_id = t.id)",
}
DELETE_UNUSED = {table: f"DELETE FROM {table} WHERE id = {unused_sql(table, unused)}"
                 for table, unused in UNUSED.items()}


def delete_unused(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    table = rnd.choice(["customers", "products"])
    return _changed(conn, DELETE_UNUSED[table], {"at": rnd.random()}, f"delete {table[:-1]}")


# Relative frequencies: mostly orders flowing through, some catalogue and customer churn.
MIX: list[tuple[Operation, int]] = [
    (new_customer, 8), (rename_customer, 6), (new_product, 4), (reprice_product, 8), (edit_description, 2),
    (place_order, 20), (advance_order, 20), (edit_item, 8), (renumber_item, 4), (remove_item, 4),
    (delete_order, 4), (delete_unused, 3),
]  # fmt: skip


def step(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    """Run one randomly chosen operation (its own transaction); returns its name, or None if it found nothing to do."""
    operations, weights = zip(*MIX, strict=True)
    return rnd.choices(operations, weights=weights)[0](conn, rnd)


def seed(
    conn: psycopg.Connection, rnd: random.Random, customers: int = 20, products: int = 10, orders: int = 20
) -> None:
    """A small starting data set, so every operation has something to act on."""
    for _ in range(customers):
        new_customer(conn, rnd)
    for _ in range(products):
        new_product(conn, rnd)
    for _ in range(orders):
        place_order(conn, rnd)
