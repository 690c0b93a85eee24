"""A product and its stock; an order of a product, which a job confirms."""

from __future__ import annotations

from django.db import models


class Product(models.Model):
    sku = models.CharField(max_length=50, unique=True)
    stock = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return str(self.sku)


class Order(models.Model):
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    quantity = models.PositiveIntegerField()
    email = models.EmailField()
    placed_at = models.DateTimeField(auto_now_add=True)
    # Set by the send_confirmation job (orders/tasks.py), once its email is sent.
    confirmed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"order {self.pk}: {self.quantity} x {self.product_id} for {self.email}"
