from miniqueue import Client

from .helpers import row


def test_enqueue_stores_an_available_job(client: Client, conn) -> None:  # type: ignore[no-untyped-def]
    result = client.enqueue("send_email", {"to": "a@example.com"}, queue="emails")
    stored = row(conn, result.id)
    assert stored["state"] == "available"
    assert stored["attempt"] == 0
    assert stored["payload"] == {"to": "a@example.com"}
