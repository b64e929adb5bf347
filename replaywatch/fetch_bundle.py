"""`replaywatch bundle --out FILE`: a running sidecar's evidence, saved to hand on.

Asks the sidecar's API for the last cycle of a target (`GET /api/v1/bundle`) or for the
bundle of an incident (`--incident N`), checks it is a bundle this replaywatch reads, and
writes it atomically: a file that exists is a whole bundle.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from typing import IO

from replaywatch import bundle as bd
from replaywatch.config import read_token
from replaywatch.errors import ConfigError

TIMEOUT_S = 30.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sidecar", default="http://127.0.0.1:9321", metavar="URL",
                   help="the sidecar's address (default http://127.0.0.1:9321)")
    p.add_argument("--out", required=True, metavar="FILE", help="where the bundle is written")
    p.add_argument("--target", metavar="HOST:PORT",
                   help="the Reverb target (needed when the sidecar watches several)")
    p.add_argument("--incident", type=int, metavar="N",
                   help="the bundle written when incident N opened (or, still open, now)")
    p.add_argument("--token-file", metavar="FILE",
                   help="bearer token for the API (or REPLAYWATCH_TOKEN)")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS")


def url_for(args: argparse.Namespace) -> str:
    base = args.sidecar.rstrip("/")
    if not base.startswith(("http://", "https://")):
        base = f"http://{base}"
    if args.incident is not None:
        return f"{base}/api/v1/incidents/{args.incident}/bundle"
    query = f"?{urllib.parse.urlencode({'target': args.target})}" if args.target else ""
    return f"{base}/api/v1/bundle{query}"


def run_fetch(args: argparse.Namespace, environ: dict[str, str], out: IO[str]) -> int:
    url = url_for(args)
    request = urllib.request.Request(url)
    token = read_token(environ, args.token_file)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as e:
        raise ConfigError(f"{url}: HTTP {e.code}: {_error_of(e.read())}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(f"{url}: no answer ({reason})") from None
    b = bd.parse(body, url)
    directory = os.path.dirname(os.path.abspath(args.out))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".bundle-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, args.out)
    except OSError as e:
        raise ConfigError(f"{args.out}: cannot write ({e.strerror or e})") from None
    findings = b.live.get("findings", [])
    worst = findings[0]["kind"] if findings else "no findings"
    print(f"{args.out}: {len(body):,} bytes, target {b.inputs.view.target}, {worst}",
          file=out)
    return 0


def _error_of(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")
