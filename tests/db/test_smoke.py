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


def test_json_values_are_read_as_written_spaces_and_all(conn: Connection) -> None:
    # A jsonb value comes without space around it; a json one keeps its text as written.
    read = conn.execute(
        """SELECT ' {"a": [1, 2.5]} '::json, '{"b": "x"}'::jsonb, '"text"'::jsonb, ' 7'::json, 'null'::jsonb"""
    ).fetchone()
    assert read == ({"a": [1, 2.5]}, {"b": "x"}, "text", 7, None)


def test_a_worker_child_leaves_what_it_built_at_start_to_no_collection() -> None:
    code = (
        "import gc; from miniqueue.core.process import settle_collector; before = gc.get_threshold(); "
        "settle_collector(); print(gc.get_freeze_count() > 0, gc.get_threshold() == before)"
    )
    settled = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert settled.split() == ["True", "True"], "frozen, and the young objects collected as often"
