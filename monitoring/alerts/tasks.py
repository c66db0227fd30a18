"""Celery tasks: take a delivery id, call the service."""
from celery import shared_task

from monitoring.alerts import delivery


@shared_task(name="monitoring.alerts.deliver")
def deliver(delivery_id):
    return delivery.deliver(delivery_id)
