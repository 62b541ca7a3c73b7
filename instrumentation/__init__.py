"""Python instrumentation of torch.distributed: spans per collective, heartbeats per rank.

Kept import-light: the instrumentor module imports torch only when instrument() runs.
"""
