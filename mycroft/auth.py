"""Bearer-token authentication and job-scoped authorisation, shared by every service.

The `--auth-config` YAML file:

    tokens:
      - token: "s3cret-ingest"        # or token_sha256: "<hex>", so the file need not hold secrets
        role: ingest                  # ingest (OTLP write) | read (API GET) | admin (both, any job)
        jobs: ["llama-*"]             # job-id globs this token may write or read; default ["*"]

Tokens are compared by their SHA-256 digest in constant time. Pure: no I/O except load().
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

ROLE_INGEST = "ingest"
ROLE_READ = "read"
ROLE_ADMIN = "admin"
ROLES = (ROLE_INGEST, ROLE_READ, ROLE_ADMIN)

#: The run of a job whose id another live run already holds is kept apart as "JOB#RUN"
#: (rca_service.ingest.state); job patterns match the JOB part.
RUN_SEPARATOR = "#"

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


class AuthConfigError(ValueError):
    """The auth file is unreadable or malformed; the message says where."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a valid token speaks for."""

    name: str
    role: str
    jobs: tuple[str, ...]

    @property
    def can_ingest(self) -> bool:
        return self.role in (ROLE_INGEST, ROLE_ADMIN)

    @property
    def can_read(self) -> bool:
        return self.role in (ROLE_READ, ROLE_ADMIN)

    @property
    def all_jobs(self) -> bool:
        return self.role == ROLE_ADMIN or "*" in self.jobs

    def allows_job(self, job: str) -> bool:
        """May this token write / read job `job` (a job id, or a run key "JOB#RUN")?"""
        if self.all_jobs:
            return True
        name = job.split(RUN_SEPARATOR, 1)[0]
        return any(fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(job, pattern)
                   for pattern in self.jobs)


#: Without --auth-config every caller is this: today's open behaviour.
ANONYMOUS_ADMIN = Principal("anonymous", ROLE_ADMIN, ("*",))


@dataclass(frozen=True, slots=True)
class _Entry:
    digest: bytes
    principal: Principal


class Authenticator:
    """Maps an Authorization header to a Principal (None: not a valid token)."""

    def __init__(self, entries: Iterable[_Entry]) -> None:
        self._entries = tuple(entries)
        if not self._entries:
            raise AuthConfigError("auth config: no tokens (an empty list would lock everyone out)")

    @classmethod
    def from_mapping(cls, document: Any, source: str = "auth config") -> Authenticator:
        if not isinstance(document, Mapping) or not isinstance(document.get("tokens"), list):
            raise AuthConfigError(f"{source}: expected a mapping with a 'tokens' list")
        entries = []
        for i, item in enumerate(document["tokens"]):
            where = f"{source}: tokens[{i}]"
            if not isinstance(item, Mapping):
                raise AuthConfigError(f"{where}: expected a mapping")
            unknown = set(item) - {"token", "token_sha256", "role", "jobs", "name"}
            if unknown:
                raise AuthConfigError(f"{where}: unknown keys {sorted(unknown)}")
            token, digest_hex = item.get("token"), item.get("token_sha256")
            if (token is None) == (digest_hex is None):
                raise AuthConfigError(f"{where}: give exactly one of 'token' or 'token_sha256'")
            if token is not None:
                if not isinstance(token, str) or len(token) < 8:
                    raise AuthConfigError(f"{where}: 'token' must be a string of at least 8 characters")
                digest = hashlib.sha256(token.encode()).digest()
            else:
                if not isinstance(digest_hex, str) or not _HEX64.match(digest_hex):
                    raise AuthConfigError(f"{where}: 'token_sha256' must be 64 hex digits")
                digest = bytes.fromhex(digest_hex)
            role = item.get("role")
            if role not in ROLES:
                raise AuthConfigError(f"{where}: 'role' must be one of {', '.join(ROLES)}")
            jobs = item.get("jobs", ["*"])
            if isinstance(jobs, str):
                jobs = [jobs]
            if not isinstance(jobs, list) or not jobs or not all(isinstance(j, str) and j for j in jobs):
                raise AuthConfigError(f"{where}: 'jobs' must be a non-empty list of glob patterns")
            name = str(item.get("name") or f"token{i}")
            entries.append(_Entry(digest, Principal(name, role, tuple(jobs))))
        return cls(entries)

    @classmethod
    def load(cls, path: str) -> Authenticator:
        try:
            with open(path, encoding="utf-8") as f:
                document = yaml.safe_load(f)
        except OSError as exc:
            raise AuthConfigError(f"auth config {path}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise AuthConfigError(f"auth config {path}: not YAML: {exc}") from exc
        return cls.from_mapping(document, f"auth config {path}")

    def token(self, token: str) -> Principal | None:
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for entry in self._entries:  # every entry compared: the time does not say which matched
            if hmac.compare_digest(entry.digest, digest):
                found = entry.principal
        return found

    def header(self, authorization: str | None) -> Principal | None:
        """`Authorization: Bearer <token>` (scheme case-insensitive) -> Principal, else None."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.token(token.strip())


def sha256_hex(token: str) -> str:
    """What to write as token_sha256 for a token."""
    return hashlib.sha256(token.encode()).hexdigest()


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
