"""Views that publish a job in the request's ``transaction.atomic`` block.

``/order/?fail=1`` raises after publishing (the whole block rolls back); ``/order/``
commits. Each responds with / logs the job id it published, so a test can look for it.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.urls import path

from platform_tasks import QueuePort, create_app
from platform_tasks.contrib.django_outbox import atomic_tx

PUBLISHED: list[str] = []
_port = QueuePort(create_app("outbox_django"))


def order(request: HttpRequest) -> HttpResponse:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS public.django_orders (id serial)")
            cur.execute("INSERT INTO public.django_orders DEFAULT VALUES")
        job = _port.publish(
            "orders",
            {"tenant_id": "t1", "kind": "shop.order", "data": {}},
            tx=atomic_tx(),
        )
        PUBLISHED.append(str(job))
        if request.GET.get("fail"):
            raise RuntimeError("the view failed after publishing")
    return HttpResponse(str(job))


def outside(request: HttpRequest) -> HttpResponse:
    try:
        atomic_tx()
    except Exception as exc:
        return HttpResponse(f"{type(exc).__name__}: {exc}", status=409)
    return HttpResponse("no error", status=200)


urlpatterns = [path("order/", order), path("outside/", outside)]
