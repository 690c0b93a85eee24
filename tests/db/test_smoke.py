import json
import subprocess
import sys

from miniqueue import Client
from miniqueue.core.db import Connection

from ..helpers import row


def test_enqueue_stores_an_available_job(client: Client, conn: Connection) -> None:
    result = client.enqueue("send_email", {"to": "a@example.com"}, queue="emails")
    stored = row(conn, result.id)
    assert stored["state"] == "available"
    assert stored["attempt"] == 0
    assert stored["payload"] == {"to": "a@example.com"}


def test_import_miniqueue_loads_none_of_the_supervisors_modules() -> None:
    # The public API is what users write code against; the supervisor, its HTTP server and the
    # store's internals load only when used, so a web app that enqueues stays light.
    heavy = ["miniqueue.supervisor", "miniqueue.children", "miniqueue.httpserver", "miniqueue.metrics", "psutil"]
    code = f"import json, sys, miniqueue; print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(loaded) == []
