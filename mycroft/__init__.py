"""Mycroft: trace collective communication, name the root cause of hangs and slowdowns."""

__version__ = "0.1.0"
