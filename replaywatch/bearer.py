"""The bearer-token check and the security headers every HTTP answer of the sidecar carries.

Standard library only: the /metrics port's own process (replaywatch/metrics_port.py) applies
them without importing the API's framework.
"""

from __future__ import annotations

import hmac

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "Cache-Control": "no-store",
}
CHALLENGE = 'Bearer realm="replaywatch"'  # WWW-Authenticate on a 401


def token_ok(header: str, expected: bytes) -> bool:
    """Whether an Authorization header carries the expected bearer token."""
    scheme, _, token = header.partition(" ")
    # compare_digest runs in time independent of where the strings differ.
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected)
