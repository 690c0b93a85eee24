"""The shop's own tests, run by Django's test runner (``manage.py test tests.django_project.shop``,
which tests/db/test_django.py runs in a subprocess) with miniqueue's testing kit: the runner's new
test database gets the queue's tables from ``migrate``, the assertions see what a
``TestCase``'s uncommitted transaction enqueued, and the test database is dropped at the end."""

from __future__ import annotations

from django.test import TestCase, TransactionTestCase

from miniqueue import ConfigError
from miniqueue.integrations.django import database_url, get_client
from miniqueue.testing import assert_enqueued, clean_database, enqueued_jobs, run_jobs

from .models import Receipt
from .tasks import app
from .views import place_order


class PlaceOrderTests(TestCase):
    """One transaction per test, rolled back at its end: the jobs are never committed."""

    def test_the_receipt_job_is_enqueued(self) -> None:
        job_id = place_order(1)
        [job] = assert_enqueued(get_client(), task="send_receipt", payload={"order": 1}, queue="mail", count=1)
        self.assertEqual(job.id, job_id)

    def test_a_declined_order_enqueues_nothing(self) -> None:
        with self.assertRaisesMessage(RuntimeError, "payment declined"):
            place_order(2, fail=True)
        self.assertEqual(enqueued_jobs(get_client(), task="send_receipt"), [])

    def test_run_jobs_asks_for_a_transaction_test_case(self) -> None:
        place_order(3)
        with self.assertRaisesMessage(ConfigError, "django.test.TransactionTestCase"):
            run_jobs(app, get_client())


class ReceiptTests(TransactionTestCase):
    """Each test's writes commit, so a worker sees its jobs."""

    def tearDown(self) -> None:
        clean_database(database_url())  # as Django's flush after each test does for its own tables

    def test_the_job_writes_the_receipt(self) -> None:
        job_id = place_order(4)
        result = run_jobs(app, get_client())
        self.assertEqual([job.id for job in result.completed], [job_id])
        self.assertEqual(Receipt.objects.get(order=4).job_id, job_id)
        self.assertEqual([job.id for job in enqueued_jobs(get_client())], [job_id])
