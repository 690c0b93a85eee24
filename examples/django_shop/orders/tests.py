"""The orders app's tests, with miniqueue's testing kit: ``python manage.py test orders``.

A ``TestCase`` runs each test in one transaction, rolled back at its end: given ``get_client()``,
the kit's assertions read on Django's connection, inside it, and see the jobs the test enqueued.
Running the jobs takes a ``TransactionTestCase``, whose writes commit, so that a worker sees them.
"""

from __future__ import annotations

from django.core import mail
from django.test import TestCase, TransactionTestCase

from miniqueue.integrations.django import database_url, get_client
from miniqueue.testing import assert_enqueued, clean_database, enqueued_jobs, run_jobs

from .models import Order, Product
from .tasks import app
from .views import place_order


class PlaceOrderTests(TestCase):
    def setUp(self) -> None:
        self.tea = Product.objects.create(sku="tea", stock=3)

    def test_an_order_enqueues_its_confirmation(self) -> None:
        response = self.client.post("/orders/", {"sku": "tea", "quantity": 2, "email": "ada@example.com"})
        self.assertEqual(response.status_code, 201, response.content)
        order = Order.objects.get()
        [job] = assert_enqueued(get_client(), task="send_confirmation", payload={"order": order.pk}, queue="emails")
        self.assertEqual(response.json(), {"order": order.pk, "job": job.id})
        self.tea.refresh_from_db()
        self.assertEqual(self.tea.stock, 1)

    def test_out_of_stock_stores_neither_the_order_nor_its_job(self) -> None:
        response = self.client.post("/orders/", {"sku": "tea", "quantity": 4, "email": "ada@example.com"})
        self.assertEqual(response.status_code, 409, response.content)
        self.assertFalse(Order.objects.exists())
        self.assertEqual(enqueued_jobs(get_client()), [])
        self.tea.refresh_from_db()
        self.assertEqual(self.tea.stock, 3)

    def test_a_wrong_form_is_refused(self) -> None:
        response = self.client.post("/orders/", {"sku": "tea", "quantity": 0, "email": "ada"})
        self.assertEqual(response.status_code, 400)
        self.assertEqual(sorted(response.json()["errors"]), ["email", "quantity"])
        self.assertEqual(enqueued_jobs(get_client()), [])


class ConfirmationTests(TransactionTestCase):
    def tearDown(self) -> None:
        clean_database(database_url())  # the queue's tables, as Django's flush empties the app's

    def test_the_job_sends_the_email_and_confirms_the_order(self) -> None:
        Product.objects.create(sku="tea", stock=3)
        order, job = place_order("tea", 1, "ada@example.com")

        result = run_jobs(app, get_client())  # a real worker, until no job is left to run

        self.assertEqual([done.id for done in result.completed], [job.id], result.summary())
        order.refresh_from_db()
        self.assertIsNotNone(order.confirmed_at)
        self.assertEqual([sent.to for sent in mail.outbox], [["ada@example.com"]])
