"""`replaywatch analyze BUNDLE`: the verdict re-derived offline from a bundle's evidence.

The same pure diagnosis the sidecar ran, over the bundle's snapshots, at the bundle's clock,
with its thresholds (or others: `--thresholds stall_window_s=30`, `--config`, or the flags
`watch` takes, `--stall-window-s 30`: "would a 30 s window have paged?"). Printed as text,
or with `--json` as the verdict document, which equals the one the sidecar gave byte for
byte when the thresholds are the bundle's. Exit 1 when the verdict has a critical finding,
0 when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import IO, Any

from replaywatch import bundle as bd
from replaywatch import config as cfg
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.errors import ConfigError
from replaywatch.model import Finding, Severity


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle file (from `replaywatch bundle` "
                   "or the sidecar's bundles directory)")
    p.add_argument("--json", action="store_true", help="print the verdict document")
    p.add_argument("--thresholds", metavar="NAME=VALUE[,...]", default=None,
                   help="thresholds to re-judge under, e.g. stall_window_s=30,down_polls=5 "
                        "(each also has its own flag: --stall-window-s 30)")


def thresholds_for(args: argparse.Namespace, flagged: dict[str, Any], bundled: Thresholds
                   ) -> Thresholds | None:
    """The bundle's thresholds with `--thresholds` and `flagged` (the config file's and the
    threshold flags', as `watch` reads them) over them; None: none given."""
    overrides = {**parse_pairs(args.thresholds or ""), **flagged}
    return cfg.thresholds_from(overrides, base=bundled) if overrides else None


def parse_pairs(text: str) -> dict[str, Any]:
    """`stall_window_s=30,down_polls=5` as typed overrides; ConfigError on a bad pair."""
    defaults = Thresholds()
    out: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not hasattr(defaults, name):
            raise ConfigError(f"--thresholds: {pair!r} is not NAME=VALUE with a known name "
                              f"({', '.join(Thresholds.field_names())})")
        kind = type(getattr(defaults, name))
        try:
            out[name] = cfg.parse_bool(value) if kind is bool else kind(value.strip())
        except ValueError:
            raise ConfigError(f"--thresholds: {name} wants a {kind.__name__}, got "
                              f"{value.strip()!r}") from None
    return out


def changed(bundled: Thresholds, used: Thresholds) -> dict[str, tuple[Any, Any]]:
    """name -> (the bundle's, the one used), for every threshold that differs."""
    return {f.name: (getattr(bundled, f.name), getattr(used, f.name))
            for f in dataclasses.fields(Thresholds)
            if getattr(bundled, f.name) != getattr(used, f.name)}


def run_analyze(args: argparse.Namespace, flagged: dict[str, Any], out: IO[str]) -> int:
    b = bd.read(args.bundle)
    th = thresholds_for(args, flagged, b.inputs.thresholds)
    findings, errors = bd.judged(b.inputs, th)
    doc = bd.verdict_document(b.inputs.view.target, b.inputs.now, findings)
    if args.json:
        # Only when a rule raised: otherwise the bytes stay the sidecar's own verdict's.
        out.write(bd.dumps_verdict({**doc, "rule_errors": list(errors)} if errors else doc))
    else:
        render_text(b, findings, doc, th, out, errors)
    return 1 if any(f.severity == Severity.CRITICAL for f in findings) else 0


def render_text(b: bd.Bundle, findings: tuple[Finding, ...], doc: dict[str, Any],
                th: Thresholds | None, out: IO[str], errors: tuple[str, ...] = ()) -> None:
    d = b.doc
    print(f"bundle: {d.get('reason')} on {d.get('host')} (replaywatch "
          f"{d.get('replaywatch_version')}, format {d.get('format_version')})", file=out)
    print(f"target: {b.inputs.view.target}, judged at {_utc(b.inputs.now)}", file=out)
    if th is not None:
        diffs = changed(b.inputs.thresholds, th)
        said = ", ".join(f"{k}={new:g} (the sidecar had {old:g})"
                         for k, (old, new) in sorted(diffs.items()))
        print(f"re-judged with {said or 'the same thresholds'}", file=out)
    elif bd.dumps_verdict(doc) == bd.dumps_verdict(b.live):
        print("the same verdict the sidecar gave", file=out)
    else:
        print("NOT the verdict the sidecar gave (its findings are in the bundle's "
              "\"verdict\"): this replaywatch's rules differ from the sidecar's", file=out)
    if b.trimmed:
        print(f"trimmed: {b.doc['dropped']} (the verdict may differ)", file=out)
    for m in d.get("missing") or []:
        print(f"missing: {m.get('what')}: {m.get('why')}", file=out)
    print(file=out)
    for error in errors:
        print(f"rule error, its finding is missing (a replaywatch bug): {error}", file=out)
    if not findings:
        print("no findings" if not errors else "no findings from the rules that judged",
              file=out)
    for f in findings:
        where = f"{f.target} {f.table}".strip()
        print(f"{f.severity.label.upper():8} {f.kind} on {where} since {_utc(f.since)}",
              file=out)
        print(f"  {f.summary}", file=out)
        for key, value in sorted(f.evidence.items()):
            if isinstance(value, (dict, list)):
                continue  # the JSON has the nested evidence
            print(f"    {key}: {value}", file=out)
        print(f"  fix: {f.fix}", file=out)


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
