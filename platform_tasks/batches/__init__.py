"""Batches: one callback after every job of a group has ended, counted in PostgreSQL."""
