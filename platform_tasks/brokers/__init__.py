"""Brokers: which broker a URL names, what it needs, and the platform's Redis transport.

- ``selection``      broker kinds (Redis, RabbitMQ), their start-up checks and Celery defaults,
                     and which kombu transport an app uses with its sweep timing
- ``worker_queues``  the queues a worker consumes when started without ``-Q``
- ``redis_client``   the Redis client the platform builds from its settings
- ``scripts``        the Lua scripts shipped in ``platform_tasks/lua``
- ``transport``      the kombu transport for Redis brokers

Nothing is imported here, so importing one module does not load the others.
"""
