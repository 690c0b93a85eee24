"""What operators read over a shard map (docs/guides/shards.md): ``jobs list``, ``jobs
show``, ``queues list`` and ``limits`` with ``--shards``, and the dashboard over a map. Every
database's rows, named, and a total; a database that does not answer named, exit 1 (the
dashboard: a banner), never counted as holding nothing.

Three databases on three real servers (the suite's and two embedded ones); a fourth entry of a
map points at a closed port, with a password that must never be shown.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from miniqueue import App, JobSpec
from miniqueue.cli.main import main
from miniqueue.client.sharded import ShardedClient, migrate_shards
from miniqueue.core.shard_map import ID_BASE, MODULUS, ShardMap
from miniqueue.testing import database as testing_db
from miniqueue.web import create_app

from ..servers import emptied_client
from ..serving import read_only_dashboard
from ..supervised import free_port
from .test_web import AUDIT, audit_lines

#: The map's queues: "mail" on b, "hot" spread over b and c with its limits held per database.
QUEUES: dict[str, Any] = {"mail": ["b"], "hot": {"databases": ["b", "c"], "limits": "per-database"}}
SECRET = "s3cret-pw"


@pytest.fixture(scope="module")
def joined(servers: list[str]) -> Iterator[dict[str, str]]:
    """Three databases, a (the origin), b and c, each on a server of its own (the suite's and two
    embedded ones), that joined the map (for the module)."""
    on = dict(zip("abc", servers, strict=True))
    dsns = {name: testing_db.create_database(on[name], prefix=f"miniqueue_inspect_{name}") for name in "abc"}
    migrate_shards(shard_map(dsns))
    yield dsns
    for name, dsn in dsns.items():
        testing_db.drop_database(on[name], dsn)


def map_json(dsns: dict[str, str], **more: str) -> str:
    """The map's JSON: the databases of ``dsns`` (indexes in order), then those of ``more``."""
    urls = {**dsns, **more}
    return json.dumps(
        {"databases": {n: {"url": u, "index": i} for i, (n, u) in enumerate(urls.items())}, "queues": QUEUES}
    )


def shard_map(dsns: dict[str, str], **more: str) -> ShardMap:
    loaded = ShardMap.load(map_json(dsns, **more))
    assert loaded is not None
    return loaded


@pytest.fixture
def closed_port() -> str:
    """A PostgreSQL URL, with a password, at a port nothing listens on."""
    return f"postgresql://ops:{SECRET}@127.0.0.1:{free_port()}/queue?connect_timeout=2"


@pytest.fixture
def sharded(joined: dict[str, str]) -> Iterator[ShardedClient]:
    """A client over the joined databases, emptied for the test."""
    yield from emptied_client(shard_map(joined))


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def json_rows(result: Result) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(result.stdout)
    return found


def enqueue_everywhere(sharded: ShardedClient) -> dict[str, list[int]]:
    """Jobs on every database: two on a, a batch of three on b (one creation time), two on c."""
    ids = {
        "a": [sharded.enqueue("t", {"n": n}).id for n in range(2)],
        "b": [r.id for r in sharded.enqueue_many([JobSpec("t", {"n": n}, queue="mail") for n in range(3)])],
        "c": [sharded.enqueue("t", queue="hot", unique_key=key).id for key in ("k1", "k3")],
    }
    assert {name: {i % MODULUS for i in found} for name, found in ids.items()} == {"a": {0}, "b": {1}, "c": {2}}
    return ids


# -- the command line ------------------------------------------------------------------------------


def test_jobs_list_merges_every_database_newest_first_and_pages_through_all_of_them(
    sharded: ShardedClient, joined: dict[str, str]
) -> None:
    ids = enqueue_everywhere(sharded)
    shards = map_json(joined)
    listed = cli("jobs", "list", "--json", "--shards", shards)
    assert listed.exit_code == 0, listed.output
    rows = json_rows(listed)
    assert {(r["database"], r["id"]) for r in rows} == {(n, i) for n, found in ids.items() for i in found}
    # Instants, not strings: each server writes its times in its own zone (the suite's embedded
    # servers and the machine's PostgreSQL may differ).
    stamps = [(dt.datetime.fromisoformat(r["created_at"]), r["id"]) for r in rows]
    assert stamps == sorted(stamps, reverse=True), "newest first by creation time, then id"
    seen: list[int] = []
    before: list[str] = []
    while True:  # pages of two, each after the last job of the page before
        page = json_rows(cli("jobs", "list", "--json", "--limit", "2", *before, "--shards", shards))
        if not page:
            break
        seen += [r["id"] for r in page]
        before = ["--before", str(page[-1]["id"])]
    assert seen == [r["id"] for r in rows], "every job once, in the same order (a batch shares its creation time)"
    text = cli("jobs", "list", "--queue", "mail", "--shards", shards)
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert lines[0].split()[:2] == ["DATABASE", "ID"] and len(lines) == 4
    assert {line.split()[0] for line in lines[1:]} == {"b"}


def test_jobs_show_reads_the_database_the_id_names(sharded: ShardedClient, joined: dict[str, str]) -> None:
    ids = enqueue_everywhere(sharded)
    shown = cli("jobs", "show", str(ids["c"][0]), "--json", "--shards", map_json(joined))
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.stdout)
    assert (found["database"], found["id"], found["queue"]) == ("c", ids["c"][0], "hot")
    text = cli("jobs", "show", str(ids["b"][1]), "--shards", map_json(joined))
    assert text.output.splitlines()[0].split() == ["database:", "b"]
    missing = cli("jobs", "show", str(ids["b"][0] + MODULUS * 100), "--shards", map_json(joined))
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_queues_list_shows_each_databases_pause_and_cap_and_each_queues_total(
    sharded: ShardedClient, joined: dict[str, str]
) -> None:
    enqueue_everywhere(sharded)
    sharded.limit_queue("hot", 3, create=True)  # a cap per database: 6 running at most in all
    sharded.client("b").pause_queues(["hot", "mail"])
    listed = cli("queues", "list", "--json", "--shards", map_json(joined))
    assert listed.exit_code == 0, listed.output
    rows = {(r["database"], r["queue"]): r for r in json_rows(listed)}
    assert set(rows) == {("a", "default"), ("b", "mail"), ("b", "hot"), ("c", "hot")} | {
        ("total", q) for q in ("default", "mail", "hot")
    }
    assert (rows[("b", "hot")]["paused"], rows[("c", "hot")]["paused"]) == (True, False)
    assert rows[("b", "hot")]["max_running"] == rows[("c", "hot")]["max_running"] == 3
    hot = rows[("total", "hot")]
    assert (hot["paused"], hot["paused_on"], hot["max_running"]) == (False, ["b"], 6)
    assert (rows[("total", "mail")]["paused"], rows[("total", "default")]["max_running"]) == (True, None)
    text = cli("queues", "list", "--shards", map_json(joined)).output
    assert any(
        line.split()[:2] == ["total", "hot"] and "paused on b" in line and "6 running in all" in line
        for line in text.splitlines()
    ), text


def test_limits_show_each_databases_slots_and_tokens_and_their_sums(
    sharded: ShardedClient, joined: dict[str, str]
) -> None:
    for n in range(4):  # round-robin over b and c: two jobs waiting on each database's "rate t"
        sharded.enqueue("t", {"n": n}, queue="hot", rate_limit="10/s")
    limits = cli("limits", "--json", "--shards", map_json(joined))
    assert limits.exit_code == 0, limits.output
    rows = {(r["database"], r["scope"]): r for r in json_rows(limits)}
    assert {key: r["waiting"] for key, r in rows.items()} == {
        ("b", "rate t"): 2,
        ("c", "rate t"): 2,
        ("total", "rate t"): 4,
    }
    rates = {name: rows[(name, "rate t")]["rate"] for name in ("b", "c", "total")}
    assert rates["total"] == rates["b"] + rates["c"] == 20, "each database grants the rate alone"
    text = cli("limits", "--shards", map_json(joined)).output.splitlines()
    assert text[0].split() == ["DATABASE", "LIMIT", "WAITING", "STATE"]
    assert [line.split()[:4] for line in text[1:]] == [
        ["b", "rate", "t", "2"],
        ["c", "rate", "t", "2"],
        ["total", "rate", "t", "4"],
    ]


def test_a_database_that_does_not_answer_is_named_never_counted_as_empty(
    sharded: ShardedClient, joined: dict[str, str], closed_port: str
) -> None:
    ids = enqueue_everywhere(sharded)
    shards = map_json(joined, d=closed_port)
    for command in (["jobs", "list"], ["queues", "list"], ["limits"], ["stats"]):
        shown = cli(*command, "--shards", shards)
        assert shown.exit_code == 1, (command, shown.output)
        assert "database d: unreachable" in shown.stderr, (command, shown.stderr)
        assert SECRET not in shown.output and "ops:***@" in shown.stderr
        as_json = json_rows(cli(*command, "--json", "--shards", shards))
        assert [r["database"] for r in as_json if "unreachable" in r] == ["d"], command
    listed = json_rows(cli("jobs", "list", "--json", "--shards", shards))
    assert {r["id"] for r in listed if "id" in r} == {i for found in ids.values() for i in found}
    on_d = ids["a"][0] - ids["a"][0] % MODULUS + 3 + MODULUS  # an id of d's, whatever it holds
    shown = cli("jobs", "show", str(on_d), "--shards", shards)
    assert shown.exit_code == 1 and "database d of the shard map did not answer" in shown.output
    assert SECRET not in shown.output


# -- the dashboard -----------------------------------------------------------------------------


@pytest.fixture
def web(sharded: ShardedClient) -> Iterator[TestClient]:
    """The dashboard over the map, for a browser on this machine."""
    with TestClient(create_app(sharded), base_url="http://localhost") as test_client:
        yield test_client


def post(web: TestClient, path: str, **fields: Any) -> httpx2.Response:
    if "miniqueue_csrf" not in web.cookies:
        web.get("/")
    data = {"csrf_token": web.cookies["miniqueue_csrf"], **fields}
    response: httpx2.Response = web.post(path, data=data, follow_redirects=False)
    return response


def listed(html: str) -> list[tuple[int, str]]:
    """The jobs a jobs page lists, in order, each with the database it names."""
    found = re.findall(r'<a href="/jobs/(\d+)">\d+</a></td>\s*<td>(\w+)</td>', html)
    return [(int(job_id), name) for job_id, name in found]


def state_on(dsn: str, job_id: int) -> str | None:
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT state FROM miniqueue_jobs WHERE id = %s", [job_id]).fetchone()
    return None if found is None else str(found[0])


def test_the_overview_shows_each_database_and_the_total(web: TestClient, sharded: ShardedClient) -> None:
    enqueue_everywhere(sharded)
    sharded.client("b").pause_queues(["hot"], create=True)
    page = web.get("/")
    assert page.status_code == 200, page.text
    rows = dict(
        re.findall(r'<tr data-database="(\w+)">\s*<th scope="row">\w+[^<]*</th>\s*<td class="num">(\d+)<', page.text)
    )
    assert rows == {"a": "2", "b": "3", "c": "2", "total": "7"}, "available jobs per database, and in all"
    assert 'id="total-available" href="/jobs?state=available">7<' in page.text
    assert "paused on b</span>" in page.text, "hot is paused on one of its two databases"
    assert 'href="/periodic"' in page.text, "every page is offered over a map"


def test_a_database_that_does_not_answer_is_a_banner_naming_it_on_every_page(
    sharded: ShardedClient, joined: dict[str, str], closed_port: str
) -> None:
    enqueue_everywhere(sharded)
    with (
        ShardedClient(shard_map(joined, d=closed_port)) as over_four,
        TestClient(create_app(over_four), base_url="http://localhost") as web,
    ):
        for path in ("/", "/jobs", "/queues", "/workers", "/periodic"):
            page = web.get(path)
            assert page.status_code == 200, (path, page.text)
            assert 'data-unreachable="d"' in page.text and "Database d did not answer" in page.text, path
            assert SECRET not in page.text and "ops:***@" in page.text, path
        overview = web.get("/").text
        assert re.search(r'<tr data-database="d">.*?did not answer', overview, re.S), "its row says so"
        assert 'state=available">7<' in overview, "the others' jobs still counted"
        assert len(listed(web.get("/jobs").text)) == 7
        job_on_d = next(i for i in range(ID_BASE, ID_BASE + MODULUS) if over_four.shards.database_of(i).name == "d")
        missing = web.get(f"/jobs/{job_on_d}")
        assert missing.status_code == 503 and "database d of the shard map did not answer" in missing.text
        assert SECRET not in missing.text


def test_the_jobs_list_merges_every_database_and_pages_through_all_of_them(
    web: TestClient, sharded: ShardedClient
) -> None:
    ids = enqueue_everywhere(sharded)
    spread = sharded.enqueue_many([JobSpec("t", {"n": n}, queue="hot") for n in range(50)])
    first = web.get("/jobs")
    assert first.status_code == 200
    page_one = listed(first.text)
    assert len(page_one) == 50 and all(sharded.shards.database_of(i).name == name for i, name in page_one)
    [older] = re.findall(r'href="/jobs\?before_id=(\d+)" rel="next"', first.text)
    page_two = listed(web.get("/jobs", params={"before_id": older}).text)
    every = {i for found in ids.values() for i in found} | {r.id for r in spread}
    assert sorted(i for i, _ in page_one + page_two) == sorted(every), "each job once over the two pages"
    mail = listed(web.get("/jobs", params={"queue": "mail"}).text)
    assert mail == [(i, "b") for i in sorted(ids["b"], reverse=True)]


def test_a_job_page_and_its_actions_go_to_the_database_its_id_names(
    web: TestClient, sharded: ShardedClient, joined: dict[str, str]
) -> None:
    ids = enqueue_everywhere(sharded)
    on_c = ids["c"][0]
    page = web.get(f"/jobs/{on_c}")
    assert page.status_code == 200 and f"Job {on_c}" in page.text and "<dt>Database</dt><dd>c</dd>" in page.text
    assert post(web, f"/jobs/{on_c}/cancel").status_code == 303
    assert state_on(joined["c"], on_c) == "cancelled"
    assert post(web, f"/jobs/{on_c}/requeue").status_code == 303
    assert state_on(joined["c"], on_c) == "available"
    assert web.get(f"/jobs/{on_c + MODULUS * 1000}").status_code == 404


def test_actions_on_jobs_of_several_databases_reach_each_of_them(
    web: TestClient, sharded: ShardedClient, joined: dict[str, str]
) -> None:
    ids = enqueue_everywhere(sharded)
    chosen = [ids["a"][0], ids["b"][0], ids["c"][0]]
    confirm = web.get("/jobs/confirm", params={"action": "cancel", "ids": chosen}).text
    assert "Cancel 3 jobs?" in confirm
    done = post(web, "/jobs/action", action="cancel", ids=[str(i) for i in chosen], expected="3")
    assert done.headers["location"] == "/jobs?done=cancel&n=3"
    assert [state_on(joined[n], i) for n, i in zip("abc", chosen, strict=True)] == ["cancelled"] * 3
    matching = {"action": "delete", "scope": "matching", "state": "available"}
    assert "Delete 4 jobs?" in web.get("/jobs/confirm", params=matching).text
    post(web, "/jobs/action", **matching, expected="3")  # at most the confirmed count, over the databases
    left = [i for n, found in ids.items() for i in found if state_on(joined[n], i) == "available"]
    assert len(left) == 1


def test_the_queues_page_shows_each_queue_over_its_databases_and_pauses_it_on_each(
    web: TestClient, sharded: ShardedClient
) -> None:
    enqueue_everywhere(sharded)
    sharded.limit_queue("hot", 3, create=True)
    sharded.client("b").pause_queues(["hot"], create=True)
    page = web.get("/queues").text
    assert "paused on b</span>" in page and "6 <span" in page and "(3 on b, 3 on c)" in page
    assert post(web, "/queues/hot/pause").headers["location"] == "/queues?done=pause"
    assert {name: sharded.client(name).paused_queues() for name in "bc"} == {"b": ["hot"], "c": ["hot"]}
    post(web, "/queues/hot/resume")
    assert {name: sharded.client(name).paused_queues() for name in "abc"} == {"a": [], "b": [], "c": []}


def periodic_app() -> App:
    """Schedules of the code on queues of each place of the map: "cleanup" (the default queue:
    the origin, a), "report" (mail: b) and "heat" (hot, over b and c: b, its first)."""
    app = App()
    app.task("cleanup", cron="0 3 * * *")(lambda job: None)
    app.task("report", queue="mail", cron="0 9 * * *")(lambda job: None)
    app.task("heat", queue="hot", cron="*/5 * * * *")(lambda job: None)
    return app


def schedules_listed(html: str) -> set[tuple[str, str]]:
    """The schedules a periodic page lists, each with the database it names."""
    return set(re.findall(r'<tr data-database="(\w+)">\s*<th scope="row">([\w-]+)', html))


def test_the_periodic_page_lists_each_databases_schedules_and_acts_on_the_database_of_each(
    sharded: ShardedClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Each database holds its own schedules: a schedule of the code lives on the database whose
    reaper runs it (its queue's first), a runtime one where it was created. The page lists every
    database's, naming it, and each action goes to that database."""
    sharded.client("c").schedules.create("digest", "0 8 * * 1", task="report")
    sharded.client("a").disable_schedule("legacy", create=True)  # recorded there, of no app of this dashboard
    caplog.set_level(logging.INFO, logger=AUDIT)
    with TestClient(create_app(sharded, app=periodic_app()), base_url="http://localhost") as web:
        page = web.get("/periodic")
        assert page.status_code == 200, page.text
        assert schedules_listed(page.text) == {
            ("a", "cleanup"), ("a", "legacy"), ("b", "heat"), ("b", "report"), ("c", "digest"),
        }  # fmt: skip
        assert 'action="/periodic/report/disable?database=b"' in page.text
        assert 'href="/periodic/digest/delete?database=c"' in page.text

        assert post(web, "/periodic/report/disable?database=b").headers["location"] == "/periodic?done=disable"
        assert sharded.client("b").periodic_state()["report"][1] is False, "switched where its reaper runs it"
        assert "report" not in sharded.client("a").periodic_state()
        post(web, "/periodic/legacy/enable?database=a")
        assert sharded.client("a").periodic_state()["legacy"][1] is True

        ran = post(web, "/periodic/heat/run?database=b")
        job_id = int(ran.headers["location"].split("/jobs/")[1].split("?")[0])
        assert sharded.shards.database_of(job_id).name == "b" and sharded.get(job_id).queue == "hot"

        confirm = web.get("/periodic/digest/delete", params={"database": "c"}).text
        assert "on database c" in confirm and 'action="/periodic/digest/delete?database=c"' in confirm
        assert post(web, "/periodic/digest/delete?database=c").headers["location"] == "/periodic?done=delete-schedule"
        assert sharded.client("c").schedules.list() == []
        assert web.get("/periodic/digest/delete", params={"database": "c"}).status_code == 404

        missing = post(web, "/periodic/report/enable")
        assert missing.status_code == 400 and "is not in the shard map (known: a, b, c)" in missing.text
        assert post(web, "/periodic/report/enable?database=z").status_code == 400
        assert sharded.client("b").periodic_state()["report"][1] is False, "a refused action changes nothing"
    assert audit_lines(caplog) == [
        "user=anonymous@testclient action=disable-schedule schedule=report database=b count=1 outcome=ok",
        "user=anonymous@testclient action=enable-schedule schedule=legacy database=a count=1 outcome=ok",
        f"user=anonymous@testclient action=run-schedule ids={job_id} schedule=heat database=b count=1 outcome=ok",
        "user=anonymous@testclient action=delete-schedule schedule=digest database=c count=1 outcome=ok",
    ]


def test_miniqueue_web_with_a_map_serves_every_database(
    sharded: ShardedClient, joined: dict[str, str], tmp_path: Path
) -> None:
    ids = enqueue_everywhere(sharded)
    env = {**os.environ, "MINIQUEUE_SHARDS": map_json(joined), "MINIQUEUE_WEB_USER": "", "MINIQUEUE_WEB_PASSWORD": ""}
    env.pop("DATABASE_URL", None)
    with read_only_dashboard(env, tmp_path / "web.log") as address:
        response = httpx2.get(f"{address}/jobs", timeout=5)
        assert response.status_code == 200
        assert {i for i, _ in listed(response.text)} == {i for found in ids.values() for i in found}
