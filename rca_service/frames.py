"""The stable import path of the analysis as data: `from mycroft.rca_service import frames`.

Users import it from notebooks, so it stays here whatever moves inside the service; the code
lives with the other post-mortem readers in postmortem/frames.py (see its docstring).
"""

from __future__ import annotations

from .postmortem.frames import (
    COLLECTIVE_COLUMNS,
    HEARTBEAT_COLUMNS,
    Recording,
    collectives_frame,
    from_files,
    from_records,
    groups_frame,
    heartbeats_frame,
    ranks_frame,
)

__all__ = ["COLLECTIVE_COLUMNS", "HEARTBEAT_COLUMNS", "Recording", "collectives_frame", "from_files",
           "from_records", "groups_frame", "heartbeats_frame", "ranks_frame"]
