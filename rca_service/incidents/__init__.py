"""Incidents: findings become incidents that open, page, resolve; stored, alerted, acted on."""
