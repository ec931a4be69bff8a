"""Dead letters: the record a failed job leaves, the table that keeps it, and replay.

- ``dead_letter``  :class:`DeadLetter`, one class for a failure a consumer records and the
  stored row it becomes; its write makes every value storable
- ``records``      the fields of a failure (error text, raw messages) and a job's newest row
- ``batch``        the one step every replay and discard runs its rows through (by id, by
  filter, the console), its outcome and the groups it settled
- ``store``        listing, replaying and discarding stored dead letters
- ``incidents``    dead letters grouped into incidents (core.alert_incidents): counted,
  resolved when none is pending review, and what is still to be sent to a sink
- ``alert_sender`` the worker thread that sends those incidents (Better Stack), retried
  from the table, never from a delivery

The console's Django model of the same table,
:class:`platform_tasks.contrib.django.models.DeadLetter`, keeps that name because Django
admin and migrations refer to it; it is the console's view of these rows, not a third
kind of dead letter.

Nothing is imported here, so importing one module does not load the others.
"""
