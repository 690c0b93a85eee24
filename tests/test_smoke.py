from miniqueue import Client
from miniqueue.db import Connection

from .helpers import row


def test_enqueue_stores_an_available_job(client: Client, conn: Connection) -> None:
    result = client.enqueue("send_email", {"to": "a@example.com"}, queue="emails")
    stored = row(conn, result.id)
    assert stored["state"] == "available"
    assert stored["attempt"] == 0
    assert stored["payload"] == {"to": "a@example.com"}
