"""PostgreSQL: connections, the schema's migrations, maintenance and named queries.

- ``database``     connections and transactions from the platform settings
- ``migrations``   the SQL migrations in ``platform_tasks/sql/migrations`` and their runner
- ``maintenance``  purging old idempotency rows, reporting stale dead letters
- ``queries``      named queries loaded from ``platform_tasks/sql``

Nothing is imported here, so importing one module does not load the others.
"""
