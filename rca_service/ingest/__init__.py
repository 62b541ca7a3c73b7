"""Ingest: admit what arrives and fold it into each job's state (the first stage of the data's way)."""
