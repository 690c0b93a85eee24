"""The shop's URLs: ``POST /orders/`` places an order, ``GET /orders/<id>/`` shows one."""

from __future__ import annotations

from django.urls import path
from orders import views

urlpatterns = [
    path("orders/", views.PlaceOrderView.as_view()),
    path("orders/<int:pk>/", views.OrderView.as_view()),
]
