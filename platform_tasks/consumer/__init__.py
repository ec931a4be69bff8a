"""The consumer: what happens to a job from the broker to its ack, one noun per module.

- ``task``             :class:`PlatformTask`, the thin Celery task base class
- ``pipeline``         the delivery pipeline: decide a verdict, settle it
- ``verdicts``         the one value a delivery comes to
- ``delivery``         what a message says about itself; the queue it came from
- ``transaction``      the job's transaction, always ended by commit or rollback
- ``attempts``         attempt numbers and delivery counting (crash loops)
- ``retry``            the retry policy and its decision
- ``idempotency``      the processed-jobs row that makes a job apply once
- ``hooks``            logs, alerts (and metrics, in ``observability.metrics``) as hooks
- ``servers``          which errors mean "wait for the servers", and the waiting
- ``event_redaction``  task events without payload data (Flower)
- ``time_limits``      an attempt killed at its hard time limit: recorded, then settled
- ``dropped_messages`` the worker consumer that dead-letters what Celery would drop

Nothing is imported here, so importing one module does not load the others.
"""
