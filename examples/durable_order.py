"""An order as a durable job: reserve stock, charge the card, wait for the warehouse to confirm
the shipment (three days at most), sleep a day, then ask for a review.

Each step runs once, however often the job runs again (a crash, a retry, a lost lease); the
sleep and the wait hold no worker and spend no attempt. Run the workers with
``miniqueue-supervise --app examples.durable_order:app``; the warehouse confirms with
``client.signal(f"shipped:{order_id}", {"carrier": "DHL"})`` (or ``miniqueue signal``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import miniqueue

app = miniqueue.App()


def reserve_stock(order_id: int) -> dict[str, Any]:
    return {"order": order_id, "reserved": True}  # a call to the stock service


def book_charge(conn: Any, order_id: int, cents: int) -> str:
    # Written on the step's own transaction: the booking and the step's record commit together.
    conn.execute("INSERT INTO payments (order_id, cents) VALUES (%s, %s)", [order_id, cents])
    return f"charge-{order_id}"


def request_review(order_id: int) -> None:
    pass  # a call to the mailer


@app.task("order")
def order(job: miniqueue.Job) -> dict[str, Any]:
    order_id, cents = job.payload["order"], job.payload["cents"]
    job.step("reserve", reserve_stock, order_id)
    charge = job.step_transaction("charge", book_charge, order_id, cents)
    try:
        shipment = job.wait_for(f"shipped:{order_id}", timeout=dt.timedelta(days=3))
    except miniqueue.SignalTimeout:
        return {"charge": charge, "shipped": False}  # a person follows it up
    job.sleep(dt.timedelta(days=1))
    job.step("review", request_review, order_id)
    return {"charge": charge, "shipped": True, "carrier": shipment["carrier"]}
