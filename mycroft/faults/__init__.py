"""Fault injection and simulation: the room where users validate a Mycroft deployment.

Not part of the RCA service: these modules launch instrumented jobs, make them misbehave
(block, kill, freeze, straggle, diverge, cut a link) or emulate a backend, and score what
the RCA service says. The service never imports them.
"""
