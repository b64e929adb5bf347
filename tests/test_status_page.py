"""The status page at `/`: served offline under a strict CSP, and read in a real browser.

The browser tests drive Debian's Chromium (`make system-deps`) through
Playwright's Python package; they never download a browser.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from harness.procs import PYTHON, ROOT, Proc, get_json, get_text, wait_until
from replaywatch.probe import ActorProbe, TrainerProbe
from tests.support.ray_dashboard import FIXTURES, TOKEN, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.long]  # starts processes (see tests/conftest.py)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts"
LAPTOP = {"width": 1366, "height": 768}
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # a name, never fetched
# The learner's name reaches the finding's summary: markup in it must stay text.
LEARNER = "<b>starved</b>-learner"
FAST_RULES = ("--interval", "0.5", "--stall-window-s", "3", "--min-history-s", "1")


def _get(base: str, path: str, headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    """GET `path` exactly as written: no client-side `..` normalisation."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


class _Assets(HTMLParser):
    """What an HTML document loads, and any inline script or style it carries."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if "style" in a or tag == "style" or any(k.startswith("on") for k in a):
            self.inline.append(f"<{tag} {attrs}>")
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append(f"<script>{data[:80]}")


def _offline_sidecar(sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path,
                     env: dict[str, str] | None = None) -> str:
    # Nothing listens on port 9: the page must still be served while the target is down.
    _, base = sidecar("--reverb", "127.0.0.1:9", "--interval", "0.5", "--db",
                      str(tmp_path / "i.db"), env=env)
    return base


def test_page_is_served_under_the_csp_with_every_asset_from_the_sidecar(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path,
) -> None:
    base = _offline_sidecar(sidecar, tmp_path)
    status, headers, body = _get(base, "/")
    assert status == 200
    assert headers["content-type"].startswith("text/html")
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    page = _Assets()
    page.feed(body.decode())
    assert page.inline == []  # the CSP would block them
    assert {"/static/status.js", "/static/status.css"} <= set(page.urls)
    expected = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    texts = [body.decode()]
    for url in page.urls:
        assert url.startswith("/static/"), url
        status, headers, asset = _get(base, url)
        assert status == 200, url
        assert headers["content-type"].startswith(expected[Path(url).suffix]), url
        assert headers["x-content-type-options"] == "nosniff"
        texts.append(asset.decode())
    for text in texts:
        assert re.findall(r"https?://[^\s\"'`)]+", text.replace(SVG_NAMESPACE, "")) == []
    script = texts[page.urls.index("/static/status.js") + 1]
    # Data from the job reaches the DOM as text only.
    sinks = r"\.(innerHTML|outerHTML)\s*\+?=|insertAdjacentHTML\(|document\.write|\beval\("
    assert re.findall(sinks, script) == []


TRAVERSALS = (
    "/static/../pyproject.toml",
    "/static/..%2fpyproject.toml",
    "/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
    "/static/..%5cpage.py",
    "/static/page.py",
    "/static/index.html",
    "/static/status.js%00.css",
    "/static/",
)


def test_static_serves_only_its_allow_list(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path,
) -> None:
    base = _offline_sidecar(sidecar, tmp_path)
    for path in TRAVERSALS:
        status, headers, body = _get(base, path)
        assert status == 404, path
        assert headers["content-type"].startswith("application/json"), path
        assert "error" in json.loads(body), path
        assert b"[build-system]" not in body and b"APIRouter" not in body, path


# -- in a real browser ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the module's page tests (1.7 CPU-s a launch here); each test
    gets a context of its own, so no storage, token or cache passes from one to the next."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("make system-deps installs Debian's chromium")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(chromium: Any) -> Iterator[Any]:
    """A page at laptop size, in a fresh context, that records errors and every request."""
    context = chromium.new_context(viewport=LAPTOP)
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.errors, page.requests = [], []
        page.on("pageerror", lambda e: page.errors.append(f"pageerror: {e}"))
        page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
        page.on("request", lambda r: page.requests.append(r.url))
        yield page
    finally:
        context.close()


def _screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    page.screenshot(path=str(path.with_name(path.stem + "-full.png")), full_page=True)
    return path


def _starved_job(spawn: Callable[..., Proc]) -> dict[str, Any]:
    """A real Reverb server + TrainerProbe whose learner hangs in next() (worker starvation)."""
    learner = spawn([PYTHON, "tests/support/starved_learner.py", "--workers", "4", "--batch",
                     "16", "--credit", "40", "--name", LEARNER], name="starved-learner")
    return learner.announce()


def _active(base: str, kind: str) -> dict[str, Any] | None:
    findings = get_json(f"{base}/api/v1/findings", 2.0)[1]["findings"]
    return next((f for f in findings if f["kind"] == kind), None)


@pytest.mark.long(seconds=30)
def test_page_shows_worker_starvation_with_evidence_fix_and_stacks(
    spawn: Callable[..., Proc], sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path,
    browser_page: Any,
) -> None:
    job = _starved_job(spawn)
    _, base = sidecar("--reverb", job["reverb"], "--probe", f"{job['reverb']}={job['probe']}",
                      *FAST_RULES, "--db", str(tmp_path / "i.db"))
    # The stranded count grows while the workers draw the limiter's credit: 40 once they all
    # have (a loaded machine's first reading was 24).
    finding = wait_until(lambda: (f := _active(base, "worker_starvation"))
                         and f["evidence"]["stranded_samples"] == 40 and f,
                         timeout_s=60, interval_s=0.5)
    assert finding["evidence"]["stranded_samples"] == 40

    page = browser_page
    page.goto(base + "/")
    card = page.locator('article.finding[data-kind="worker_starvation"]')
    card.wait_for(state="visible")
    evidence = card.locator(".evidence")
    for key, value in (("stranded_samples", "40"), ("batch_size", "16"), ("workers", "4")):
        assert evidence.locator(f'[data-key="{key}"] dd').inner_text() == value
    # Its loop's gate unknown, the fix that holds under both readings: error_buffer 0 gives a
    # scheduled loop nothing to start on, so one worker alone is no fix.
    assert "error_buffer=61" in card.locator(".fix").inner_text()
    summary = card.locator(".summary")
    assert f"The learner '{LEARNER}' is blocked in next()" in summary.inner_text()
    assert summary.locator("b").count() == 0
    # The stacks are taken when the critical finding opens; the learner waits in __next__.
    card.locator(".frame.hot").first.wait_for(state="visible")
    assert "__next__" in card.locator(".frame.hot").first.inner_text()
    # The table's charts: the synchronous layout has no max_diff line to plot.
    limiter = page.locator('article.table-card[data-table$="/replay"] figure.limiter')
    assert limiter.get_attribute("data-insert-blocking") == "disabled"
    assert "insert blocking disabled" in limiter.inner_text()
    assert page.locator("svg.limiter-chart polyline.cursor").count() == 1
    assert page.locator("svg.rates-chart polyline.sample").count() == 1
    assert page.locator("#targets .pill.up").count() == 1
    assert page.locator("#probes .pill.up").count() == 1
    # The replay process's memory beside its table, read on this host (its table has no
    # signature and never grows enough to measure an item: no bytes per item are shown).
    facts = page.locator('article.table-card[data-table$="/replay"] dl.facts')
    assert re.fullmatch(r"[\d.]+ [KMG]iB of [\d.]+ [KMG]iB \((host|cgroup v[12])\)",
                        facts.locator('[data-memory="now"]').inner_text())
    assert facts.locator('[data-memory="item"]').count() == 0
    # The pipeline the probe read from the learner's tf.data graph (it declared none of it
    # but batch and workers): Acme's per-worker shape, one sample in flight each.
    assert page.locator("#probes td.pipeline").inner_text() == (
        "read: 4 worker(s), each batching 16, 1 in flight, 16 B an item")
    assert page.locator('#incidents tr[data-incident] td.kind', has_text="worker_starvation"
                        ).count() == 1
    # Each incident links its Markdown report, built from its bundle.
    row = page.locator("#incidents tr[data-incident]", has_text="worker_starvation")
    href = row.locator("a.report").get_attribute("href")
    assert href == f"/api/v1/incidents/{row.get_attribute('data-incident')}/report"
    status, report = get_text(base + href)
    assert status == 200 and report.startswith("# replaywatch: ")
    assert "## The blocked thread" in report and " in __next__" in report
    # Live: the page redraws without a reload.
    first = page.locator("body").get_attribute("data-updated")
    page.locator(f"body:not([data-updated={json.dumps(first)}])").wait_for(state="attached")

    shot = _screenshot(page, "status-page-worker-starvation.png")
    assert shot.stat().st_size > 10_000
    assert page.errors == []  # no CSP violation, no script error
    assert all(url.startswith(base + "/") for url in page.requests), page.requests


def test_page_escapes_what_the_job_reports(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path,
    browser_page: Any,
) -> None:
    # A probe URL is shown verbatim on the page; markup in it must stay text.
    hostile = "http://127.0.0.1:9/<img/src=x/onerror=alert(1)>"
    _, base = sidecar("--reverb", "127.0.0.1:9", "--probe", f"127.0.0.1:9={hostile}",
                      "--interval", "0.5", "--db", str(tmp_path / "j.db"))
    wait_until(lambda: get_json(f"{base}/api/v1/probes")[1]["probes"], timeout_s=15)
    page = browser_page
    page.goto(base + "/")
    page.locator("#probes tr[data-probe]").wait_for()
    assert page.locator("#probes img").count() == 0
    assert hostile in page.locator("#probes").inner_text()
    assert page.locator("#targets .pill.down").count() == 1
    assert page.errors == []


def test_page_reads_a_token_from_the_fragment(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path, browser_page: Any,
) -> None:
    base = _offline_sidecar(sidecar, tmp_path, env={"REPLAYWATCH_TOKEN": "s3cret-token"})
    if _get(base, "/")[0] == 401:
        pytest.skip("app.py still requires the token for / and /static/ (the page holds no data)")
    assert _get(base, "/api/v1/targets")[0] == 401
    page = browser_page
    page.goto(base + "/")
    page.locator("#banner", has_text="needs a token").wait_for()
    page.goto(base + "/#token=s3cret-token")
    page.locator("#targets tr[data-target]").wait_for()
    page.locator("#banner").wait_for(state="hidden")
    assert "token" not in page.url  # moved out of the address bar



class _StuckWriter:
    """A writer whose flush() waits for the test: an actor stuck in flush."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def append(self, step: Any) -> None:
        pass

    def create_item(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self, *args: Any, **kwargs: Any) -> None:
        self.gate.wait(60)


def test_page_shows_actors_stuck_in_a_writer_call_or_waiting_on_the_learner(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path, browser_page: Any,
) -> None:
    stuck = ActorProbe(table="replay", name="actor-stuck", listen="127.0.0.1:0")
    waiter = ActorProbe(table="replay", name="actor-waits", listen="127.0.0.1:0")
    inner = _StuckWriter()
    writer = stuck.wrap_writer(inner)
    leave = threading.Event()

    def wait_for_learner() -> None:
        with waiter.waiting("learner"):
            leave.wait(60)

    threads = [threading.Thread(target=writer.flush, daemon=True),
               threading.Thread(target=wait_for_learner, daemon=True)]
    stuck.start()
    waiter.start()
    try:
        for _ in range(4):
            stuck.step()
            writer.append({})
        writer.create_item("replay", 1, 1.0)
        writer.create_item("replay", 1, 1.0)
        waiter.step()
        for t in threads:
            t.start()
        _, base = sidecar("--reverb", "127.0.0.1:9", "--probe", f"127.0.0.1:9={stuck.url}",
                          "--probe", f"127.0.0.1:9={waiter.url}", "--interval", "0.5",
                          "--db", str(tmp_path / "a.db"))
        wait_until(lambda: {p["role"] for p in get_json(f"{base}/api/v1/probes")[1]["probes"]}
                   == {"actor"}, timeout_s=15)
        page = browser_page
        page.goto(base + "/")
        row = page.locator(f'#actors tr[data-actor="{stuck.url}"]')
        row.wait_for()
        assert "actor-stuck" in row.locator("td.name").inner_text()
        assert row.locator(".pill.up").count() == 1
        assert row.locator("td.in-call").inner_text().startswith("flush ")
        assert row.locator("td.waiting").inner_text() == "no"
        cells = row.locator("td").all_inner_texts()
        assert cells[6:8] == ["2", "2"]  # items created, pending items
        other = page.locator(f'#actors tr[data-actor="{waiter.url}"]')
        assert other.locator("td.waiting").inner_text().startswith("learner ")
        assert other.locator("td.in-call").inner_text() == "none"
        # Actors are not trainer probes: that table stays empty.
        assert page.locator("#probes tr[data-probe]").count() == 0
        _screenshot(page, "status-page-actors.png")
        assert page.errors == []
    finally:
        inner.gate.set()
        leave.set()
        for t in threads:
            t.join(5)
        stuck.stop()
        waiter.stop()


def test_page_says_the_verdict_is_incomplete_while_a_rule_cannot_judge(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path, browser_page: Any,
) -> None:
    # No rule of a real sidecar raises on demand: the page gets the sidecar's own findings
    # answer with one rule error added, as a sidecar whose rule raised sends it.
    base = _offline_sidecar(sidecar, tmp_path)
    error = "127.0.0.1:9: is_spi_drift: KeyError: 'evidence'"

    def with_error(route: Any) -> None:
        answer = route.fetch()
        route.fulfill(response=answer, json={**answer.json(), "findings": [],
                                             "rule_errors": [error]})

    page = browser_page
    page.route("**/api/v1/findings*", with_error)
    page.goto(base + "/")
    note = page.locator("#rule-errors")
    note.wait_for(state="visible")
    assert error in note.inner_text() and "its finding is missing" in note.inner_text()
    assert page.locator("#verdict").inner_text() == "incomplete: 1 rule(s) could not judge"
    assert "sev-warning" in page.locator("#verdict").get_attribute("class")
    assert "Nothing wrong" not in page.locator("#findings").inner_text()
    page.unroute("**/api/v1/findings*")
    note.wait_for(state="hidden")  # the next answer has none: the note goes
    assert not page.locator("#verdict").inner_text().startswith("incomplete")
    assert page.errors == []


def test_page_shows_the_learners_priority_updates_and_refusals(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path, browser_page: Any,
) -> None:
    import numpy as np
    import reverb

    server = reverb.Server([reverb.Table("replay", reverb.selectors.Prioritized(0.8),
                                         reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))], port=None)
    client = reverb.Client(f"127.0.0.1:{server.port}")
    for _ in range(10):
        client.insert([np.zeros(2, np.float32)], {"replay": 1.0})
    probe = TrainerProbe(table="replay", batch_size=8, name="learner-priorities")
    probe.start()
    try:
        learner = probe.wrap_client(client, inserts=False)
        keys = [int(s[0].info.key) for s in client.sample("replay", num_samples=4)]
        learner.mutate_priorities("replay", {k: 2.0 for k in keys})
        with pytest.raises(Exception, match="Priority must not be NaN"):
            learner.mutate_priorities("replay", {keys[0]: float("nan")})
        target = f"127.0.0.1:{server.port}"
        _, base = sidecar("--reverb", target, "--probe", f"{target}={probe.url}",
                          "--interval", "0.5", "--db", str(tmp_path / "p.db"))
        page = browser_page
        page.goto(base + "/")
        cell = page.locator(f'#probes tr[data-probe="{probe.url}"] td[data-health="replay"]')
        cell.wait_for()
        wait_until(lambda: "refused" in cell.inner_text(), timeout_s=15)
        # Each call's keys, the refused one's too (a sample may draw one item twice).
        sent = len(set(keys)) + 1
        assert cell.inner_text() == f"replay: 2 priority updates, {sent} keys, 1 refused"
        assert page.errors == []
    finally:
        probe.stop()
        server.stop()


def test_page_shows_an_rllib_job_beside_the_reverb_targets(
    sidecar: Callable[..., tuple[Proc, str]], tmp_path: Path, browser_page: Any,
) -> None:
    """A Ray cluster (its dashboard served from recorded documents) watched with --ray: its
    actors, their running calls and the job's latest iteration in "RLlib jobs", the cluster
    in the targets list beside a Reverb target."""
    cluster = Cluster(tmp_path, "metrics_appo.txt")
    try:
        token, results = tmp_path / "token", tmp_path / "appo" / "result.json"
        token.write_text(TOKEN)
        results.parent.mkdir()
        results.write_bytes((FIXTURES / "result_appo.jsonl").read_bytes())
        _, base = sidecar("--reverb", "127.0.0.1:9", "--ray", cluster.address,
                          "--ray-token-file", str(token), "--ray-temp-dir",
                          str(cluster.temp_dir), "--ray-results", str(results),
                          "--interval", "0.5", "--db", str(tmp_path / "r.db"))
        wait_until(lambda: get_json(f"{base}/api/v1/ray")[1]["jobs"], timeout_s=15)
        page = browser_page
        page.goto(base + "/")
        job = page.locator(f'#ray [data-ray-target="{cluster.dashboard}"]')
        job.wait_for()
        assert "job 02000000" in job.inner_text() and "iteration 3" in job.inner_text()
        roles = job.locator("tr[data-ray-actor] td:nth-child(2)").all_inner_texts()
        assert {"env_runner", "learner"} <= set(roles)
        calls = job.locator("tr[data-ray-actor] td:nth-child(6)").all_inner_texts()
        assert any(c.startswith("SingleAgentEnvRunner.apply ") for c in calls), calls
        targets = page.locator("#targets tr[data-target]").all_inner_texts()
        assert any(cluster.dashboard in t and "(Ray)" in t for t in targets), targets
        assert any("127.0.0.1:9" in t for t in targets)
        _screenshot(page, "status-page-rllib.png")
        # "Jobs": each target a job of its own here (no job label), the worst first; the
        # Reverb one down. Its link scopes the page to that job: the Ray job leaves it.
        jobs = page.locator("#jobs tr[data-job]")
        wait_until(lambda: jobs.count() == 2, timeout_s=10)
        by_job = {jobs.nth(i).get_attribute("data-job"): jobs.nth(i).inner_text()
                  for i in range(2)}
        assert set(by_job) == {cluster.dashboard, "127.0.0.1:9"}, by_job
        assert "down" in by_job["127.0.0.1:9"]
        page.locator('#jobs tr[data-job="127.0.0.1:9"] a').click()
        page.wait_for_url("**/?job=127.0.0.1%3A9")
        page.locator("#job-scope").wait_for()
        wait_until(lambda: page.locator("#ray p.empty").count() == 1, timeout_s=10)
        targets = page.locator("#targets tr[data-target]").all_inner_texts()
        assert targets and all("127.0.0.1:9" in t for t in targets), targets
        assert page.errors == []
    finally:
        cluster.close()
