"""Publishing: how a job becomes a broker message, now or later.

- ``queue_port``              :class:`QueuePort`, the one way code publishes and schedules jobs
- ``wire``                    the Celery message a Redis broker carries (headers, body, properties)
- ``amqp_wire``               the same message as RabbitMQ publishes it
- ``delay_store``             jobs due later, kept in Redis until their time
- ``promotion_loop``          the one promoter thread loop; each broker supplies its pass
- ``delay_promoter``          the pass that moves due jobs from the Redis delay store onto queues
- ``rabbitmq_delay_promoter`` the same for RabbitMQ brokers, with publisher confirms
- ``native_delays``           delays the broker holds itself (countdown/eta)
- ``confirmed_publisher``     AMQP confirm mode: a publish returns once the broker has it
- ``outbox``                  ``publish(..., tx=)``: the message as a row of the caller's tx
- ``outbox_relay``            committed outbox rows to the broker, from every worker and beat

Nothing is imported here, so importing one module does not load the others.
"""
