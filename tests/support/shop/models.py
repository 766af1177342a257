"""The app's one model: an order, written in the same transaction as its job."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)

    class Meta:
        app_label = "shop"
        db_table = "shop_order"
