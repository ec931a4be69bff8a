"""Dead letters: the record a failed job leaves, the table that keeps it, and replay.

- ``records``  what a dead-letter row holds (always storable), written by the consumer
- ``store``    listing, replaying and discarding stored dead letters

Nothing is imported here, so importing one module does not load the others.
"""
