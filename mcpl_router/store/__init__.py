"""Durable state: the journal (embedded SQLite)."""
