"""mycroft.rca_service: the root cause analysis service, one package per stage of the data's way.

    ingest/ -> analysis/ -> incidents/ -> web/ ; postmortem/ feeds the same analysis from files

(docs/architecture.md; tests/test_layering.py keeps the arrows pointing one way). The stable
surface, kept where users import it whatever moves inside: the `mycroft rca ...` command line
(`mycroft.rca_service.cli`), `mycroft.rca_service.frames` (a recording as DataFrames), and the
HTTP API (`/api/v1/...`, described at `/api/v1/openapi.json`). Everything else is internal and may move.
"""
