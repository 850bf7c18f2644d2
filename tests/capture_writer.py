"""A writer thread for the capture tests: mixed single-statement transactions on the four demo tables,
with each customer's committed states recorded in commit order."""

from __future__ import annotations

import random
import threading
import uuid
from dataclasses import dataclass, field

import psycopg

from services.settings import StackSettings
from services.stack import postgres


@dataclass
class History:
    """Committed states of each customer, in commit order (None = deleted)."""

    states: dict[int, list[str | None]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, key: int, state: str | None) -> None:
        with self.lock:
            self.states.setdefault(key, []).append(state)


class Writer(threading.Thread):
    """Mixed single-statement transactions on all four tables; records customer history after commit."""

    def __init__(self, settings: StackSettings, marker: str, history: History, seed: int) -> None:
        super().__init__(daemon=True)
        self.settings, self.marker, self.history = settings, marker, history
        self.random = random.Random(seed)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.versions: dict[int, int] = {}
        # Seed rows may be updated but never deleted, so each must show up as a snapshot read.
        self.undeletable: set[int] = set()

    def run(self) -> None:
        try:
            with psycopg.connect(postgres.conninfo(self.settings), autocommit=True) as conn:
                while not self.stop.is_set():
                    self.step(conn)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the fixture
            self.error = exc

    def step(self, conn: psycopg.Connection) -> None:
        live = [k for k, states in self.history.states.items() if states[-1] is not None]
        roll = self.random.random()
        if roll < 0.35 or not live:
            key = conn.execute(
                "INSERT INTO customers (email, name, country) VALUES (%s, %s, 'GB') RETURNING id",
                (f"{uuid.uuid4().hex[:10]}@{self.marker}.test", f"{self.marker}-v0"),
            ).fetchone()[0]
            self.versions[key] = 0
            self.history.record(key, f"{self.marker}-v0")
        elif roll < 0.8:
            key = self.random.choice(live)
            self.versions[key] += 1
            name = f"{self.marker}-v{self.versions[key]}"
            conn.execute("UPDATE customers SET name = %s, updated_at = now() WHERE id = %s", (name, key))
            self.history.record(key, name)
        elif roll < 0.9 and (deletable := [k for k in live if k not in self.undeletable]):
            key = self.random.choice(deletable)
            deleted = conn.execute(
                "DELETE FROM customers c "
                "WHERE id = %s AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id)",
                (key,),
            ).rowcount
            if deleted:
                self.history.record(key, None)
        else:
            with conn.transaction():
                order = conn.execute(
                    "INSERT INTO orders (customer_id, status, total) SELECT id, 'pending', 10.00 FROM customers "
                    "WHERE email LIKE %s ORDER BY id LIMIT 1 RETURNING id",
                    (f"%@seed-{self.marker}.test",),
                ).fetchone()[0]
                conn.execute(
                    "INSERT INTO order_items (order_id, line_no, product_id, quantity, unit_price) "
                    "SELECT %s, 1, id, 2, price FROM products WHERE sku LIKE %s ORDER BY id LIMIT 1",
                    (order, f"{self.marker}-%"),
                )
            conn.execute("UPDATE orders SET status = 'paid', updated_at = now() WHERE id = %s", (order,))
