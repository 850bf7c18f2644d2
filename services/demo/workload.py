"""A realistic, reproducible workload on the demo schema: one transaction per operation.

Customers sign up and get renamed; orders are placed with items, paid, shipped
or cancelled; items are edited, renumbered (a primary-key change) and removed;
products get price changes (their TOASTed description untouched) and large
description edits; unreferenced rows are deleted. The same seed gives the same
sequence of operations against the same starting data.
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

DESCRIPTION_SQL = "(SELECT string_agg(md5(%s || g::text), '') FROM generate_series(1, %s) g)"


def _pick(conn: psycopg.Connection, rnd: random.Random, sql: str) -> int | None:
    """A random id from a query returning ids (PostgreSQL's random(), seeded by `step`)."""
    row = conn.execute(sql + " ORDER BY random() LIMIT 1").fetchone()
    return row[0] if row else None


def new_customer(conn: psycopg.Connection, rnd: random.Random) -> str:
    name = "".join(rnd.choices(string.ascii_lowercase, k=8)).title()
    conn.execute(
        # A seed replayed against the same database repeats emails: a duplicate sign-up is skipped.
        "INSERT INTO customers (email, name, country) VALUES (%s, %s, %s) ON CONFLICT (email) DO NOTHING",
        (f"{name.lower()}.{rnd.getrandbits(40):x}@example.com", name, rnd.choice(["GB", "FR", "DE", "US", "JP"])),
    )
    return "new customer"


def rename_customer(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    key = _pick(conn, rnd, "SELECT id FROM customers")
    if key is None:
        return None
    conn.execute("UPDATE customers SET name = %s, updated_at = now() WHERE id = %s", (f"Renamed {rnd.getrandbits(24)}", key))
    return "rename customer"


def new_product(conn: psycopg.Connection, rnd: random.Random) -> str:
    conn.execute(
        f"INSERT INTO products (sku, name, description, price, tags, attributes) "
        f"VALUES (%s, %s, {DESCRIPTION_SQL}, %s, %s, %s) ON CONFLICT (sku) DO NOTHING",
        (
            f"SKU-{rnd.getrandbits(48):012x}",
            f"Product {rnd.getrandbits(16)}",
            str(rnd.random()),
            rnd.randint(50, 700),  # 1.6-22 KB of incompressible text: TOASTed
            Decimal(rnd.randint(100, 99_999)) / 100,
            rnd.sample(["new", "sale", "eco", "gift", "bulk"], k=2),
            json.dumps({"weight_g": rnd.randint(10, 5000), "dims": {"h": rnd.randint(1, 50)}}),
        ),
    )
    return "new product"


def reprice_product(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    """Leaves the TOASTed description unchanged, so Debezium sends its placeholder."""
    key = _pick(conn, rnd, "SELECT id FROM products")
    if key is None:
        return None
    conn.execute(
        "UPDATE products SET price = %s, updated_at = now() WHERE id = %s",
        (Decimal(rnd.randint(100, 99_999)) / 100, key),
    )
    return "reprice product"


def edit_description(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    key = _pick(conn, rnd, "SELECT id FROM products")
    if key is None:
        return None
    conn.execute(
        f"UPDATE products SET description = {DESCRIPTION_SQL}, updated_at = now() WHERE id = %s",
        (str(rnd.random()), rnd.randint(50, 700), key),
    )
    return "edit description"


def place_order(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    customer = _pick(conn, rnd, "SELECT id FROM customers")
    products = conn.execute("SELECT id, price FROM products ORDER BY random() LIMIT %s", (rnd.randint(1, 3),)).fetchall()
    if customer is None or not products:
        return None
    with conn.transaction():
        order = conn.execute(
            "INSERT INTO orders (customer_id, status, total) VALUES (%s, 'pending', 0) RETURNING id", (customer,)
        ).fetchone()[0]
        for line_no, (product, price) in enumerate(products, start=1):
            conn.execute(
                "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price) VALUES (%s, %s, %s, %s, %s)",
                (order, line_no, product, rnd.randint(1, 5), price),
            )
        conn.execute(
            "UPDATE orders SET total = (SELECT sum(quantity * unit_price) FROM order_items WHERE order_id = %s) "
            "WHERE id = %s",
            (order, order),
        )
    return "place order"


def advance_order(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    key = _pick(conn, rnd, "SELECT id FROM orders WHERE status IN ('pending', 'paid')")
    if key is None:
        return None
    conn.execute(
        "UPDATE orders SET status = CASE status WHEN 'pending' THEN %s::order_status ELSE 'shipped' END, "
        "updated_at = now() WHERE id = %s",
        (rnd.choice(["paid", "paid", "cancelled"]), key),
    )
    return "advance order"


def edit_item(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    row = conn.execute("SELECT order_id, line_no FROM order_items ORDER BY random() LIMIT 1").fetchone()
    if row is None:
        return None
    conn.execute(
        "UPDATE order_items SET quantity = %s WHERE order_id = %s AND line_no = %s", (rnd.randint(1, 9), *row)
    )
    return "edit item"


def renumber_item(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    """A primary-key change: Debezium emits delete + tombstone + create."""
    row = conn.execute("SELECT order_id, line_no FROM order_items ORDER BY random() LIMIT 1").fetchone()
    if row is None:
        return None
    conn.execute(
        "UPDATE order_items SET line_no = (SELECT max(line_no) + 1 FROM order_items WHERE order_id = %s) "
        "WHERE order_id = %s AND line_no = %s",
        (row[0], *row),
    )
    return "renumber item"


def remove_item(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    row = conn.execute("SELECT order_id, line_no FROM order_items ORDER BY random() LIMIT 1").fetchone()
    if row is None:
        return None
    conn.execute("DELETE FROM order_items WHERE order_id = %s AND line_no = %s", row)
    return "remove item"


def delete_order(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    key = _pick(conn, rnd, "SELECT id FROM orders WHERE status = 'cancelled'")
    if key is None:
        return None
    with conn.transaction():
        conn.execute("DELETE FROM order_items WHERE order_id = %s", (key,))
        conn.execute("DELETE FROM orders WHERE id = %s", (key,))
    return "delete order"


def delete_unused(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    table = rnd.choice(["customers", "products"])
    child = "orders WHERE customer_id" if table == "customers" else "order_items WHERE product_id"
    # Probe rows (the benchmark's freshness markers) must stay until they are read back from every view.
    probe = f"AND t.email NOT LIKE '%@{PROBE_DOMAIN}'" if table == "customers" else ""
    key = _pick(conn, rnd, f"SELECT id FROM {table} t WHERE NOT EXISTS (SELECT 1 FROM {child} = t.id) {probe}")
    if key is None:
        return None
    conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
    return f"delete {table[:-1]}"


# Relative frequencies: mostly orders flowing through, some catalogue and customer churn.
MIX: list[tuple[Operation, int]] = [
    (new_customer, 8), (rename_customer, 6), (new_product, 4), (reprice_product, 8), (edit_description, 2),
    (place_order, 20), (advance_order, 20), (edit_item, 8), (renumber_item, 4), (remove_item, 4),
    (delete_order, 4), (delete_unused, 3),
]  # fmt: skip


def step(conn: psycopg.Connection, rnd: random.Random) -> str | None:
    """Run one randomly chosen operation (its own transaction); returns its name, or None if it found nothing to do."""
    operations, weights = zip(*MIX)
    # Seed PostgreSQL's random() from ours, so the same seed picks the same rows.
    conn.execute("SELECT setseed(%s)", (rnd.uniform(-1, 1),))
    return rnd.choices(operations, weights=weights)[0](conn, rnd)


def seed(conn: psycopg.Connection, rnd: random.Random, customers: int = 20, products: int = 10, orders: int = 20) -> None:
    """A small starting data set, so every operation has something to act on."""
    conn.execute("SELECT setseed(%s)", (rnd.uniform(-1, 1),))  # place_order's picks repeat with the seed
    for _ in range(customers):
        new_customer(conn, rnd)
    for _ in range(products):
        new_product(conn, rnd)
    for _ in range(orders):
        place_order(conn, rnd)
