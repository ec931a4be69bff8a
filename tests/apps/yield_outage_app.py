"""An app whose worker runs the marketing yield and also applies plain jobs.

One marketing NotificationTask (so the yield watches the provider buckets in the
platform's Redis as well as the transactional depth) and one PlatformTask on the default
queue whose work is a row in ``public.consumer_work``: a job that needs neither a token
nor Redis on its first delivery, so how fast it is applied shows whether the worker's
event loop is free while the platform's Redis is away.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from platform_tasks import Envelope, PlatformTask, create_app
from platform_tasks.notifications import EmailMessage, NotificationTask

QUEUE = "consumer"

app = create_app("yield_outage_app", task_default_queue=QUEUE)


class Work(BaseModel):
    key: str


class Chunk(BaseModel):
    recipients: list[str]
    campaign_id: str
    chunk: int


@app.task(name="tests.yield_outage.apply", base=PlatformTask, data_model=Work)
def apply_work(envelope: Envelope[Work], tx: Any) -> None:
    tx.execute(
        "INSERT INTO public.consumer_work (job_id, key) VALUES (%s, %s)",
        (str(envelope.job_id), envelope.data.key),
    )


@app.task(base=NotificationTask, data_model=Chunk, name="notify.newsletter", rail="marketing")
def newsletter(envelope: Any, tx: Any) -> list[EmailMessage]:
    return [
        EmailMessage("News <news@example.com>", r, "News", html="<p>news</p>")
        for r in envelope.data.recipients
    ]
