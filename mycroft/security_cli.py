"""Command-line flags for the services' security: --auth-config and --tls-* (docs/security.md).

Shared by `mycroft rca serve` and `mycroft processor serve`, so both spell and check them alike.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from mycroft.auth import Authenticator, is_loopback
from mycroft.otlp_server import split_host_port

log = logging.getLogger("mycroft.security")


def security_args(parser: argparse.ArgumentParser, client_ca: bool = True) -> None:
    """--auth-config and --tls-* (shared with `mycroft processor serve`)."""
    group = parser.add_argument_group("security (docs/security.md)")
    group.add_argument("--auth-config", metavar="FILE",
                       help="YAML file of bearer tokens (role ingest|read|admin, job patterns); without it "
                            "anyone who reaches a port may write and read")
    group.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain (needs --tls-key)")
    group.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    if client_ca:
        group.add_argument("--tls-client-ca", metavar="PEM",
                           help="require client certificates signed by this CA (mutual TLS)")


def security_options(args: argparse.Namespace, prog: str) -> tuple[Any, Any]:
    """(Authenticator | None, TlsFiles | None) from the flags; SystemExit with a clear message when wrong."""
    from mycroft.auth import AuthConfigError
    from mycroft.http_server import TlsFiles

    auth = None
    if args.auth_config:
        try:
            auth = Authenticator.load(args.auth_config)
        except AuthConfigError as exc:
            raise SystemExit(f"{prog}: {exc}") from exc
    client_ca = getattr(args, "tls_client_ca", None)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit(f"{prog}: --tls-cert and --tls-key go together")
    if client_ca and not args.tls_cert:
        raise SystemExit(f"{prog}: --tls-client-ca needs --tls-cert and --tls-key")
    tls = None
    if args.tls_cert:
        tls = TlsFiles(args.tls_cert, args.tls_key, client_ca)
        try:
            tls.server_context()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise SystemExit(f"{prog}: cannot use --tls-cert/--tls-key: {exc}") from exc
    return auth, tls


def open_addresses(addresses: list[str | None]) -> list[str]:
    """The listen addresses not on loopback (what a network can reach)."""
    return [a for a in addresses if a and not is_loopback(split_host_port(a)[0])]


def warn_if_open(component: str, addresses: list[str | None], auth: Authenticator | None) -> None:
    """Binding beyond loopback without auth: say so loudly, on stderr and in the log."""
    exposed = open_addresses(addresses)
    if auth is None and exposed:
        text = (f"WARNING: {component} listens on {', '.join(exposed)} WITHOUT AUTHENTICATION: anyone who "
                "reaches these ports can send spans and read what the service knows. Pass --auth-config FILE "
                "(and --tls-cert/--tls-key), or bind 127.0.0.1.")
        log.warning(text)
        print(text, file=sys.stderr, flush=True)
