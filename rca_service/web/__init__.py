"""Web: the HTTP API, the incident pages and their drawings, the OpenAPI document."""
