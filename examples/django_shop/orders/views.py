"""Placing an order: the order, its confirmation job and the stock it takes commit together, or
not at all."""

from __future__ import annotations

from django import forms
from django.db import transaction
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from miniqueue import EnqueueResult
from miniqueue.integrations.django import enqueue

from .models import Order, Product


class OrderForm(forms.Form):
    sku = forms.CharField(max_length=50)
    quantity = forms.IntegerField(min_value=1)
    email = forms.EmailField()


class OutOfStock(Exception):
    """Fewer items in stock than the order asks for: nothing is stored."""


def place_order(sku: str, quantity: int, email: str) -> tuple[Order, EnqueueResult]:
    """Create an order, enqueue its confirmation and take its items from the stock, in one
    transaction. Product.DoesNotExist or OutOfStock: none of the three is stored."""
    with transaction.atomic():
        product = Product.objects.get(sku=sku)
        order = Order.objects.create(product=product, quantity=quantity, email=email)
        # On Django's own connection, inside this block: the job exists only if the block commits,
        # and workers hear of it at that commit.
        job = enqueue("send_confirmation", {"order": order.pk}, queue="emails")
        # One conditional UPDATE takes the items, so that two orders never take the same ones.
        if not Product.objects.filter(pk=product.pk, stock__gte=quantity).update(stock=F("stock") - quantity):
            raise OutOfStock(f"{quantity} x {sku!r} ordered, and fewer are in stock")  # rolls back order and job
    return order, job


# An API for programs (curl, in README.md), which send no CSRF token; a view behind a login
# form keeps Django's CSRF check.
@method_decorator(csrf_exempt, name="dispatch")
class PlaceOrderView(View):
    def post(self, request: HttpRequest) -> JsonResponse:
        """``POST /orders/`` with the fields of OrderForm: 201 and the ids of the order and its
        job; 400 for a field missing or wrong, 404 for an unknown sku, 409 when the stock is short."""
        form = OrderForm(request.POST)
        if not form.is_valid():
            return JsonResponse({"errors": form.errors}, status=400)
        try:
            order, job = place_order(**form.cleaned_data)
        except Product.DoesNotExist:
            return JsonResponse({"error": f"no product {form.cleaned_data['sku']!r}"}, status=404)
        except OutOfStock as short:
            return JsonResponse({"error": str(short)}, status=409)
        return JsonResponse({"order": order.pk, "job": job.id}, status=201)


class OrderView(View):
    def get(self, request: HttpRequest, pk: int) -> JsonResponse:
        """``GET /orders/<id>/``: the order, and when its confirmation was sent (null until then)."""
        order = get_object_or_404(Order.objects.select_related("product"), pk=pk)
        confirmed = None if order.confirmed_at is None else order.confirmed_at.isoformat()
        return JsonResponse(
            {"order": order.pk, "sku": order.product.sku, "quantity": order.quantity, "confirmed_at": confirmed}
        )
