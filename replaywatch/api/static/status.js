// replaywatch status page: polls the sidecar's JSON API and redraws.
//
// Everything shown comes from the watched job (table names, errors, evidence,
// stacks), so text goes in through textContent and createElement only, never
// innerHTML. The CSP forbids inline script and style: looks are CSS classes.
// A token, when the sidecar needs one, comes from the fragment (#token=...),
// which the browser never sends to the server, and goes out as a Bearer header.
"use strict";

(function () {
  const POLL_MS = 2000;
  const HISTORY_S = 300;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const FLOAT_BIG = 1e300; // Reverb's "no limit": float max or -float max
  const SEVERITY = { critical: 3, warning: 2, info: 1 };

  // ?job=NAME (a "Jobs" row's link): the page shows that job's targets only.
  const JOB = new URLSearchParams(location.search).get("job");
  const stacksCache = new Map(); // incident id -> incident detail with stacks
  const openDetails = new Set(); // keys of <details> the user opened or closed
  let lastOk = null;

  // -- helpers --------------------------------------------------------------------------------

  // The token moves from the fragment to this tab's sessionStorage and out of the address
  // bar, so it does not linger in history or on a shared screen.
  function takeTokenFromHash() {
    const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (!m) return;
    sessionStorage.setItem("replaywatch.token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }

  function token() {
    return sessionStorage.getItem("replaywatch.token");
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    const r = await fetch(path, { headers: headers, cache: "no-store", credentials: "omit" });
    let body = null;
    try {
      body = await r.json();
    } catch (e) {
      body = null;
    }
    if (!r.ok) {
      const why = body && typeof body.error === "string" ? body.error : r.statusText;
      const err = new Error(r.status + " " + why);
      err.status = r.status;
      throw err;
    }
    return body;
  }

  // el("td", {class: "x", "data-kind": k}, child, "text", ...): never parses HTML.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      node.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function append(node, children) {
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  function fill(id, ...children) {
    const node = document.getElementById(id);
    node.replaceChildren();
    append(node, children);
  }

  function num(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v !== "number") return String(v);
    if (!isFinite(v)) return String(v);
    if (v >= FLOAT_BIG) return "float max";
    if (v <= -FLOAT_BIG) return "−float max";
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    const a = Math.abs(v);
    if (a >= 1e6) return v.toExponential(3);
    if (a >= 100) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    return v.toPrecision(3);
  }

  function bytes(v) {
    if (v === null || v === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(2)) + " " + units[i];
  }

  // The replay process's memory beside a table: what it uses against its limit, what an
  // item costs (measured as the table fills, else the signature's upper bound) and where
  // max_size takes it. Nothing where the server's host is not read.
  function memoryFacts(memory, t) {
    const m = memory.memory.find((x) => x.target === t.target);
    const tm = memory.tables.find((x) => x.target === t.target && x.table === t.name);
    const out = [];
    if (m) {
      out.push(el("dt", {}, "memory"),
        el("dd", { "data-memory": "now" }, (m.pid === null ? "gone · " : "")
          + bytes(m.counted_bytes) + " of " + bytes(m.limit_bytes) + " (" + m.limit_from + ")"));
    }
    if (tm) {
      out.push(el("dt", {}, "bytes / item"),
        el("dd", { "data-memory": "item" }, num(Math.round(tm.bytes_per_item)) + " (" + tm.source + ")"));
      if (tm.projected_bytes !== null) {
        const over = m && tm.projected_bytes > m.limit_bytes;
        out.push(el("dt", {}, "at max_size"),
          el("dd", { "data-memory": "projected", class: over ? "error" : "" },
            bytes(tm.projected_bytes) + (over ? " (over the limit)" : "")));
      }
    }
    return out;
  }

  // What the learner took per insert (its probe's batches), beside the server's count,
  // which includes what the prefetch drew ahead; and that backlog, in samples and seconds.
  function consumedFacts(c) {
    if (!c || c.consumed_per_insert === null) return [];
    const ahead = c.unconsumed_samples === null ? "–" : num(Math.round(c.unconsumed_samples))
      + (c.unconsumed_s === null ? "" : " (" + (c.unconsumed_s < 10
        ? c.unconsumed_s.toFixed(2) + "s" : duration(c.unconsumed_s)) + " of training)");
    return [el("dt", {}, "trained / insert"),
      el("dd", { "data-consumption": "ratio" }, num(c.consumed_per_insert)),
      el("dt", {}, "drawn, not trained"), el("dd", { "data-consumption": "ahead" }, ahead)];
  }

  function duration(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + "s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + (s % 60) + "s";
    const h = Math.floor(m / 60);
    if (h < 48) return h + "h " + (m % 60) + "m";
    return Math.floor(h / 24) + "d " + (h % 24) + "h";
  }

  function ago(t) {
    if (t === null || t === undefined) return "never";
    return duration(Date.now() / 1000 - t) + " ago";
  }

  function clock(t) {
    if (t === null || t === undefined) return "–";
    const d = new Date(t * 1000);
    const day = d.toLocaleDateString("en-CA");
    const today = new Date().toLocaleDateString("en-CA");
    const time = d.toLocaleTimeString("en-GB", { hour12: false });
    return day === today ? time : day + " " + time;
  }

  function pill(ok, yes, no) {
    return el("span", { class: "pill " + (ok ? "up" : "down") }, ok ? yes : no);
  }

  function table(headers, rows, cls) {
    return el(
      "table",
      { class: cls || "grid" },
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows),
    );
  }

  // <details> that keep their open state across redraws.
  function details(key, defaultOpen, summary, ...body) {
    const open = openDetails.has(key) ? !defaultOpen : defaultOpen;
    const node = el("details", { open: open, "data-key": key }, el("summary", {}, summary), body);
    node.addEventListener("toggle", () => {
      if (node.open !== defaultOpen) openDetails.add(key);
      else openDetails.delete(key);
    });
    return node;
  }

  // -- charts ---------------------------------------------------------------------------------

  const W = 560;
  const H = 150;
  const PAD = { l: 64, r: 8, t: 8, b: 20 };

  // Round steps (1, 2, 5 x 10^n) covering [lo, hi] in about `count` intervals.
  function ticks(lo, hi, count) {
    const raw = (hi - lo) / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return out;
  }

  function agoLabel(s) {
    return s === 0 ? "now" : s >= 60 ? "-" + +(s / 60).toFixed(1) + "m" : "-" + Math.round(s) + "s";
  }

  // series: [{cls, points: [[t, v|null], ...]}]; lines break at nulls. The time axis spans
  // the history there is (at least a minute), up to HISTORY_S.
  function chart(series, opts) {
    const t1 = opts.now;
    let first = t1;
    for (const s of series) if (s.points.length) first = Math.min(first, s.points[0][0]);
    const t0 = t1 - Math.min(HISTORY_S, Math.max(60, t1 - first));
    let lo = Infinity;
    let hi = -Infinity;
    for (const s of series) {
      for (const [t, v] of s.points) {
        if (v === null || !isFinite(v) || t < t0) continue;
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
    }
    if (!isFinite(lo)) {
      lo = 0;
      hi = 1;
    }
    if (opts.floorZero) lo = Math.min(0, lo);
    if (hi - lo < 1e-9) {
      hi += 1;
      if (!opts.floorZero || lo < 0) lo -= 1;
    }
    const pad = (hi - lo) * 0.08;
    hi += pad;
    if (!opts.floorZero || lo < 0) lo -= pad;
    const x = (t) => PAD.l + ((t - t0) / (t1 - t0)) * (W - PAD.l - PAD.r);
    const y = (v) => PAD.t + (1 - (v - lo) / (hi - lo)) * (H - PAD.t - PAD.b);

    const root = svg("svg", {
      viewBox: `0 0 ${W} ${H}`,
      class: "chart " + (opts.cls || ""),
      role: "img",
      "aria-label": opts.label,
    });
    for (const v of ticks(lo, hi, 4)) {
      root.append(
        svg("line", { x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v), class: "gridline" }),
        svg("text", { x: PAD.l - 4, y: y(v) + 4, class: "axis", "text-anchor": "end" },
          Math.abs(v) >= 1e6 ? v.toExponential(1) : String(+v.toPrecision(6))),
      );
    }
    const span = t1 - t0;
    for (const [t, anchor] of [[t0, "start"], [t0 + span / 2, "middle"], [t1, "end"]]) {
      root.append(svg("text", { x: x(t), y: H - 4, class: "axis", "text-anchor": anchor },
        agoLabel(t1 - t)));
    }
    if (opts.band) {
      const [blo, bhi] = opts.band;
      const top = y(Math.min(hi, bhi));
      const bottom = y(Math.max(lo, blo));
      if (bottom > top) {
        root.append(svg("rect", {
          x: PAD.l, y: top, width: W - PAD.l - PAD.r, height: bottom - top, class: "band",
        }));
      }
    }
    for (const s of series) {
      let run = [];
      const flush = () => {
        if (run.length === 1) {
          root.append(svg("circle", { cx: run[0][0], cy: run[0][1], r: 2, class: "dot " + s.cls }));
        } else if (run.length > 1) {
          const d = run.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ");
          root.append(svg("polyline", { points: d, class: "line " + s.cls }));
        }
        run = [];
      };
      for (const [t, v] of s.points) {
        if (v === null || !isFinite(v) || t < t0) flush();
        else run.push([x(t), y(v)]);
      }
      flush();
    }
    return root;
  }

  function legend(items) {
    return el(
      "div",
      { class: "legend" },
      items.map(([cls, label, value]) =>
        el("span", { class: "key" }, el("span", { class: "swatch " + cls }), label,
          value === undefined ? null : el("b", {}, " " + value))),
    );
  }

  function ratesChart(points, now) {
    const pick = (k) => points.map((p) => [p.observed_at, p.derived ? p.derived[k] : null]);
    const last = points.length ? points[points.length - 1].derived || {} : {};
    return el(
      "figure",
      { class: "rates" },
      el("figcaption", {}, "Insert and sample rate (items/s)"),
      legend([
        ["insert", "insert", num(last.insert_rate)],
        ["sample", "sample", num(last.sample_rate)],
      ]),
      chart(
        [
          { cls: "insert", points: pick("insert_rate") },
          { cls: "sample", points: pick("sample_rate") },
        ],
        { now: now, floorZero: true, label: "insert and sample rates", cls: "rates-chart" },
      ),
    );
  }

  function cursorOf(p) {
    if (p.derived) return p.derived.cursor;
    const rl = p.rate_limiter;
    return rl.inserts * rl.samples_per_insert - rl.samples;
  }

  function bandChart(points, latest, now) {
    const rl = latest.rate_limiter;
    const noMax = rl.max_diff >= FLOAT_BIG;
    const noMin = rl.min_diff <= -FLOAT_BIG;
    const series = [{ cls: "cursor", points: points.map((p) => [p.observed_at, cursorOf(p)]) }];
    const flat = (v) => points.map((p) => [p.observed_at, v]);
    if (!noMin) series.push({ cls: "min", points: flat(rl.min_diff) });
    if (!noMax) series.push({ cls: "max", points: flat(rl.max_diff) });
    const keys = [["cursor", "cursor", num(cursorOf(latest))]];
    keys.push(noMin ? ["min off", "sampling not held (min_diff −float max)"]
      : ["min", "min_diff", num(rl.min_diff)]);
    keys.push(noMax ? ["max off", "insert blocking disabled"] : ["max", "max_diff", num(rl.max_diff)]);
    return el(
      "figure",
      { class: "limiter", "data-insert-blocking": noMax ? "disabled" : "enabled" },
      el("figcaption", {}, "Rate limiter: cursor = inserts × spi − samples"),
      legend(keys),
      chart(series, {
        now: now,
        label: "rate limiter cursor against min_diff and max_diff",
        band: [noMin ? -Infinity : rl.min_diff, noMax ? Infinity : rl.max_diff],
        cls: "limiter-chart",
      }),
    );
  }

  // -- sections -------------------------------------------------------------------------------

  // Every job watched, the worst first (GET /api/v1/fleet); each links to its own page.
  function renderJobs(doc) {
    const pillOf = { ok: "up", info: "idle" };
    const rows = doc.jobs.map((j) =>
      el("tr", { "data-job": j.job, class: "sev-" + j.health },
        el("td", { class: "name" }, el("a", { href: "?job=" + encodeURIComponent(j.job) }, j.job)),
        el("td", {}, el("span", { class: "pill " + (pillOf[j.health] || "down") }, j.health)),
        el("td", { class: "num" }, num(j.targets.length)),
        el("td", { class: "num" }, j.down.length ? num(j.down.length) : ""),
        el("td", {}, Object.entries(j.findings).map(([s, n]) => n + " " + s).join(", ")),
        el("td", { class: "summary" }, j.worst ? j.worst.kind + " on " + j.worst.target
          + ": " + j.worst.summary : "")));
    fill("jobs", rows.length
      ? table(["job", "health", "targets", "down", "findings", "worst"], rows, "grid jobs")
      : el("p", { class: "empty" }, "no job watched yet"));
    const scope = document.getElementById("job-scope");
    scope.hidden = !JOB;
    if (JOB) {
      scope.replaceChildren("Showing job " + JOB + " only · ", el("a", { href: "/" }, "every job"));
    }
  }

  // The targets of the job the page is scoped to (every target when it is not).
  function inJob(fleet) {
    if (!JOB) return () => true;
    const job = fleet.jobs.find((j) => j.job === JOB);
    const mine = new Set(job ? job.targets : []);
    return (target) => mine.has(target);
  }

  function scoped(docs, fleet) {
    if (!JOB) return docs;
    const keep = inJob(fleet);
    const [targets, tables, probes, findings, incidents, ray] = docs;
    return [
      Object.assign({}, targets, { targets: targets.targets.filter((t) => keep(t.target)),
        probes: (targets.probes || []).filter((t) => keep(t.target)),
        ray: (targets.ray || []).filter((t) => keep(t.target)) }),
      Object.assign({}, tables, { tables: tables.tables.filter((t) => keep(t.target)) }),
      Object.assign({}, probes, { probes: probes.probes.filter((p) => keep(p.target)) }),
      Object.assign({}, findings, { findings: findings.findings.filter((f) => keep(f.target)) }),
      Object.assign({}, incidents, { incidents: (incidents.incidents || []).filter(
        (i) => keep(i.target)) }),
      Object.assign({}, ray, { jobs: ray.jobs.filter((j) => keep(j.target)
        || keep(j.target + " job " + j.job_id)) }),
    ];
  }

  function renderTargets(doc) {
    const rows = doc.targets.concat(doc.ray || []).map((t) =>
      el("tr", { "data-target": t.name },
        el("td", { class: "name" }, t.name, t.kind === "ray" ? " (Ray)" : ""),
        el("td", {}, pill(t.up, "up", "down")),
        el("td", {}, ago(t.last_ok_at)),
        el("td", { class: "num" }, num(t.last_duration_s === null ? null : t.last_duration_s * 1000)),
        el("td", { class: "num" }, num(t.failures_total) + " / " + num(t.polls_total)),
        el("td", { class: "error" }, t.last_error || "")));
    fill("targets", rows.length
      ? table(["target", "state", "last ok", "poll ms", "failed / polls", "last error"], rows)
      : el("p", { class: "empty" }, "no targets"));
  }

  // The learner's pipeline as the probe read it from the tf.data graph: what every
  // learner-side verdict rests on, so a wrong declaration is seen beside the truth.
  function pipelineText(s) {
    if (s.pipeline_read === false) return "not read: " + (s.pipeline_reason || "");
    const r = s.read;
    if (!s.pipeline_read || !r) return "–";
    const threads = r.num_parallel_calls_autotune ? "AUTOTUNE (judged as 1)" : num(r.num_parallel_calls);
    const item = r.item_bytes ? ", " + num(r.item_bytes) + " B an item" : "";
    if (r.batch_after_interleave) {
      const samplers = Math.min(r.batch_size || 0, r.cycle_length || 32);
      return "read: " + num(samplers) + " Reverb datasets × " + num(r.max_in_flight)
        + " in flight, " + threads + " thread(s), one batch of " + num(r.batch_size)
        + " after the interleave" + item;
    }
    const iters = r.iterators_per_worker > 1 ? " × " + num(r.iterators_per_worker) + " iterators" : "";
    return "read: " + threads + " worker(s)" + iters + ", each batching " + num(r.batch_size)
      + ", " + num(r.max_in_flight) + " in flight" + item;
  }

  // The learner's replay as its probe counts it: the priority updates it sent (and Reverb
  // refused), and what its batches' SampleInfo says of the sampler's reach.
  function healthText(s) {
    const parts = (s.priority_updates || []).map((u) => u.table + ": " + num(u.calls)
      + " priority updates, " + num(u.keys) + " keys" + (u.errors ? ", " + num(u.errors) + " refused" : ""));
    const b = s.batch_stats;
    if (b) {
      if (b.effective_sample_size != null && b.table_size) {
        parts.push("batches draw from " + (100 * b.effective_sample_size / b.table_size).toFixed(1)
          + "% of the table");
      }
      if (b.batches_repeated) parts.push(num(b.batches_repeated) + " batches repeated");
    }
    return parts.join(" · ") || "–";
  }

  function renderProbes(doc) {
    // A replay probe's reading is the memory shown with each table, not a learner's.
    const rows = doc.probes.filter((p) => p.role !== "actor" && p.role !== "replay").map((p) => {
      const s = p.snapshot || {};
      const shape = s.pipeline || {};  // the one the rules judge: read, declared where unread
      const blocked = s.blocked_in_next
        ? el("span", { class: "pill warn" }, "blocked " + duration(s.blocked_for_s || 0))
        : el("span", { class: "pill idle" }, p.snapshot ? "not in next()" : "–");
      return el("tr", { "data-probe": p.probe },
        el("td", { class: "name" }, s.name || "", el("div", { class: "url" }, p.probe)),
        el("td", {}, pill(p.up, "up", "down")),
        el("td", {}, blocked),
        el("td", { class: "num" }, num(s.batches_retrieved)),
        el("td", { class: "num" }, num(shape.batch_size) + " × " + num(shape.num_parallel_calls)),
        el("td", { class: "num" }, num(s.thread_count)),
        el("td", { class: "pipeline" }, pipelineText(s)),
        el("td", { "data-health": "replay" }, healthText(s)),
        el("td", { class: "error" }, p.last_error || ""));
    });
    fill("probes", rows.length
      ? table(["probe", "state", "next()", "batches", "batch × workers", "threads", "pipeline", "replay health", "last error"], rows)
      : el("p", { class: "empty" }, "no trainer probe attached (add --probe URL for the learner's view)"));
  }

  // Actor probes: is each actor stepping, stuck inside a writer call, or waiting on
  // something outside Reverb (the learner, parameters)? The three tell dead actors from
  // blocked ones and from actors that wait for the learner.
  // An RLlib job read from outside: its actors (restarts, deaths) and the calls running in
  // them, aged: a call far older than the others is where a job waits.
  function renderRay(doc) {
    const blocks = doc.jobs.map((j) => {
      const calls = new Map(j.tasks.map((t) => [t.worker_pid, t]));
      const rows = j.actors.map((a) => {
        const call = calls.get(a.pid);
        return el("tr", { "data-ray-actor": a.actor_id },
          el("td", { class: "name" }, a.class_name.split(".").pop()),
          el("td", {}, a.role),
          el("td", {}, pill(a.state === "ALIVE", a.state, a.state)),
          el("td", { class: "num" }, num(a.num_restarts)),
          el("td", { class: "num" }, a.pid ? String(a.pid) : ""),
          el("td", {}, call ? call.name + " " + duration(call.running_for_s || 0) : ""),
          el("td", { class: "error" }, a.death_cause || ""));
      });
      const row = j.results[j.results.length - 1] || {};
      return el("div", { class: "ray-job", "data-ray-target": j.target },
        el("p", {}, j.target + " · job " + (j.job_id || "none found") +
          (j.ray_version ? " · Ray " + j.ray_version : "") +
          (row.iteration != null ? " · iteration " + row.iteration + " (" +
            duration(row.time_this_iter_s || 0) + ")" : "") +
          (j.driver_pid ? " · driver pid " + j.driver_pid : "")),
        rows.length ? table(["actor", "role", "state", "restarts", "pid", "running call",
          "death cause"], rows) : el("p", { class: "empty" }, "no actor of the job"),
        j.errors.length ? el("p", { class: "error" }, j.errors.join("; ")) : "");
    });
    fill("ray", blocks.length ? el("div", {}, ...blocks)
      : el("p", { class: "empty" }, "no RLlib job watched (add --ray HOST:PORT of its dashboard)"));
  }

  function renderActors(doc) {
    const rows = doc.probes.filter((p) => p.role === "actor").map((p) => {
      const s = p.snapshot;
      const call = s.in_call
        ? el("span", { class: "pill warn" }, s.in_call + " " + duration(s.blocked_for_s || 0))
        : el("span", { class: "pill idle" }, "none");
      const wait = s.waiting_on
        ? el("span", { class: "pill warn" }, s.waiting_on + " " + duration(s.waiting_for_s || 0))
        : el("span", { class: "pill idle" }, "no");
      return el("tr", { "data-actor": p.probe },
        el("td", { class: "name" }, s.name || "", el("div", { class: "url" }, p.probe)),
        el("td", {}, pill(p.up, "up", "down")),
        el("td", { class: "num steps-per-s" }, num(p.steps_per_s)),
        el("td", { class: "num since-step" },
          s.seconds_since_last_step === null ? "no step yet" : duration(s.seconds_since_last_step)),
        el("td", { class: "in-call" }, call),
        el("td", { class: "waiting" }, wait),
        el("td", { class: "num" }, num(s.items_created_total)),
        el("td", { class: "num" }, num(s.pending_items)),
        el("td", { class: "num" }, num(s.os_threads)),
        el("td", { class: "error" }, p.last_error || s.last_error || ""));
    });
    fill("actors", rows.length
      ? table(["actor", "state", "steps/s", "since last step", "in writer call", "waiting on",
        "items created", "pending items", "OS threads", "last error"], rows)
      : el("p", { class: "empty" },
        "no actor probe attached (add --probe URL of an ActorProbe for the actors' view)"));
  }

  function renderTables(doc, histories, now, memory) {
    const cards = doc.tables.map((t) => {
      const d = t.derived || {};
      const key = t.target + "/" + t.name;
      const points = histories.get(key) || [t];
      const facts = el("dl", { class: "facts" },
        el("dt", {}, "size"),
        el("dd", {}, num(t.current_size) + " / " + num(t.max_size) + " ",
          el("meter", { min: 0, max: Math.max(1, t.max_size), value: t.current_size })),
        el("dt", {}, "can sample"), el("dd", {}, pill(d.can_sample, "yes", "no")),
        el("dt", {}, "can insert"), el("dd", {}, pill(d.can_insert, "yes", "no")),
        el("dt", {}, "sample headroom"), el("dd", {}, num(d.sample_headroom)),
        el("dt", {}, "insert headroom"),
        el("dd", {}, d.insert_blocking_disabled ? "unlimited" : num(d.insert_headroom)),
        el("dt", {}, "samples / insert"),
        el("dd", {}, num(d.observed_samples_per_insert) + " (configured "
          + num(t.rate_limiter.samples_per_insert) + ")"),
        el("dt", {}, "inserts / samples"),
        el("dd", {}, num(t.rate_limiter.inserts) + " / " + num(t.rate_limiter.samples)),
        ...consumedFacts(t.consumption),
        ...memoryFacts(memory, t));
      const state = d.warming_up ? el("span", { class: "pill idle" }, "warming up") : null;
      return el("article", { class: "table-card", "data-table": key },
        el("h3", {}, el("span", { class: "name" }, t.name), " ",
          el("span", { class: "dim" }, "on " + t.target), " ", state),
        facts,
        el("div", { class: "charts" }, ratesChart(points, now), bandChart(points, t, now)));
    });
    fill("tables", cards.length ? cards : el("p", { class: "empty" }, "no tables seen yet"));
  }

  // A compact grid of key/value pairs: evidence has 10-20 entries and must not push the
  // fix and the stacks off a laptop screen.
  function evidenceGrid(evidence) {
    const items = Object.entries(evidence || {}).map(([k, v]) =>
      el("div", { class: "item", "data-key": k },
        el("dt", {}, k),
        el("dd", {}, typeof v === "object" && v !== null ? JSON.stringify(v) : num(v))));
    return el("dl", { class: "evidence" }, items);
  }

  // Probe /stacks: {url: {threads: [{name, frames: [{file, line, function, code}]}]}};
  // py-spy: {"py-spy:PID": {threads: [{thread_name, frames: [{name, filename, line}]}]}}.
  function renderStacks(stacks) {
    const sources = Object.entries(stacks || {}).map(([source, doc]) => {
      if (!doc || doc.error || !Array.isArray(doc.threads)) {
        return el("div", { class: "stack-source" }, el("h5", {}, source),
          el("p", { class: "error" }, doc && doc.error ? doc.error : "no threads"));
      }
      const pyspy = source.startsWith("py-spy:");
      const threads = doc.threads.map((th) => {
        const name = th.name || th.thread_name || String(th.ident || th.thread_id || "?");
        let frames = (th.frames || []).map((f) => ({
          fn: f.function || f.name || "?",
          file: f.file || f.filename || "?",
          line: f.line,
          code: f.code || "",
        }));
        if (pyspy) frames = frames.slice().reverse(); // py-spy lists innermost first
        const hot = frames.some((f) => f.fn === "__next__");
        const list = el("ol", { class: "frames" }, frames.map((f) =>
          el("li", { class: f.fn === "__next__" ? "frame hot" : "frame" },
            el("span", { class: "fn" }, f.fn), " ",
            el("span", { class: "where" }, f.file + ":" + (f.line === undefined ? "?" : f.line)),
            f.code ? el("code", {}, f.code) : null)));
        return details("thread:" + source + ":" + name, hot,
          [el("span", { class: hot ? "thread hot" : "thread" }, name),
            " ", el("span", { class: "dim" }, frames.length + " frames"),
            hot ? el("span", { class: "pill warn" }, "in __next__") : null],
          list);
      });
      return el("div", { class: "stack-source" }, el("h5", {}, source), threads);
    });
    return el("div", { class: "stacks" },
      el("h4", {}, "Stacks of the probed processes (innermost frame last)"),
      sources);
  }

  // Cards persist across polls (keyed by finding id) so a stack the reader has scrolled or
  // expanded is not rebuilt every two seconds: only the moving parts are redrawn.
  const cards = new Map(); // finding id -> {card, content, stacks, stacksFor}

  function findingCard(f, now) {
    let entry = cards.get(f.id);
    if (!entry) {
      const content = el("div", { class: "content" });
      const stacks = el("div", { class: "stacks-slot" });
      const card = el("article", { "data-kind": f.kind, "data-id": f.id }, content, stacks);
      entry = { card: card, content: content, stacks: stacks, stacksFor: undefined };
      cards.set(f.id, entry);
    }
    entry.card.className = "finding sev-" + f.severity;
    entry.card.setAttribute("data-severity", f.severity);
    const where = f.table ? f.target + " / " + f.table : f.target;
    entry.content.replaceChildren(
      el("header", {},
        el("span", { class: "sev" }, f.severity),
        el("span", { class: "kind" }, f.kind),
        el("span", { class: "where" }, where),
        el("span", { class: "since" },
          "for " + duration(now - f.since) + " (since " + clock(f.since) + ")"),
        f.incident_id ? el("span", { class: "dim" }, "incident #" + f.incident_id) : null),
      el("p", { class: "summary" }, f.summary),
      el("div", { class: "fix" }, el("span", { class: "label" }, "Fix"), el("p", {}, f.fix)),
      details("evidence:" + f.id, true, "Evidence", evidenceGrid(f.evidence)));
    const detail = f.incident_id ? stacksCache.get(f.incident_id) : null;
    const stacks = detail && detail.stacks ? detail.stacks : null;
    const key = f.severity === "critical" ? (stacks ? "stacks:" + f.incident_id : "pending") : "";
    if (entry.stacksFor !== key) {
      entry.stacksFor = key;
      entry.stacks.replaceChildren();
      if (key === "pending") {
        entry.stacks.append(el("p", { class: "note stacks-pending" },
          "Stacks: not captured (yet). They are taken when a critical finding opens, "
          + "from each probe's /stacks (trainer and actors) or py-spy (--trainer-pid)."));
      } else if (stacks) {
        entry.stacks.append(renderStacks(stacks));
      }
    }
    return entry.card;
  }

  function renderFindings(doc, now) {
    const findings = doc.findings.slice().sort((a, b) =>
      (SEVERITY[b.severity] || 0) - (SEVERITY[a.severity] || 0) || a.since - b.since);
    const live = findings.map((f) => findingCard(f, now));
    for (const id of Array.from(cards.keys())) {
      if (!findings.some((f) => f.id === id)) cards.delete(id);
    }
    // A rule that raised could not judge: its finding is missing, so an empty list is
    // not "nothing wrong" (older sidecars send no rule_errors).
    const ruleErrors = doc.rule_errors || [];
    const container = document.getElementById("findings");
    const emptyText = ruleErrors.length
      ? "No active findings from the rules that judged (see below)."
      : "Nothing wrong: no active findings.";
    const same = live.length === container.children.length
      && live.every((c, i) => container.children[i] === c);
    if (!same) {
      container.replaceChildren();
      append(container, live.length ? live
        : [el("p", { class: "empty" + (ruleErrors.length ? "" : " ok") }, emptyText)]);
    }
    const errors = document.getElementById("rule-errors");
    errors.hidden = !ruleErrors.length;
    errors.textContent = ruleErrors.length
      ? "A replaywatch rule could not judge, so its finding is missing (a bug in replaywatch; "
        + "please report it): " + ruleErrors.join("; ") : "";
    const insufficient = document.getElementById("insufficient");
    insufficient.hidden = !doc.insufficient_data.length;
    insufficient.textContent = doc.insufficient_data.length
      ? "Insufficient data (too young to judge): " + doc.insufficient_data.join(", ") : "";
    const worst = findings.length ? findings[0].severity : null;
    const verdict = document.getElementById("verdict");
    verdict.className = "verdict " + (worst ? "sev-" + worst
      : ruleErrors.length ? "sev-warning" : "ok");
    verdict.textContent = worst ? findings.length + " active finding(s), worst " + worst
      : ruleErrors.length ? "incomplete: " + ruleErrors.length + " rule(s) could not judge"
        : "healthy";
  }

  // The incident's Markdown report (from its bundle), to paste into an issue tracker. With
  // a token the link cannot carry the header: the report is fetched and saved as a file.
  function reportLink(id) {
    const path = "/api/v1/incidents/" + id + "/report";
    const link = el("a", { class: "report", href: path, "data-incident": id }, "report");
    link.addEventListener("click", async (event) => {
      const t = token();
      if (!t) return;
      event.preventDefault();
      const r = await fetch(path, { headers: { Authorization: "Bearer " + t },
        cache: "no-store", credentials: "omit" });
      const text = await r.text();
      const save = el("a", { href: URL.createObjectURL(new Blob([text],
        { type: "text/markdown" })), download: "incident-" + id + ".md" });
      save.click();
      URL.revokeObjectURL(save.href);
    });
    return link;
  }

  function renderIncidents(doc) {
    if (doc.log === "disabled") {
      fill("incidents", el("p", { class: "empty" }, "incident log disabled"));
      return;
    }
    const rows = doc.incidents.map((i) =>
      el("tr", { "data-incident": i.id, class: "sev-" + i.severity },
        el("td", { class: "num" }, "#" + i.id),
        el("td", {}, el("span", { class: "pill " + (i.state === "open" ? "down" : "idle") },
          i.state)),
        el("td", {}, el("span", { class: "sev" }, i.severity)),
        el("td", { class: "kind" }, i.kind),
        el("td", { class: "name" }, i.table ? i.target + " / " + i.table : i.target),
        el("td", {}, clock(i.since)),
        // An open incident's row is written on transitions only: its age is now - since.
        el("td", { class: "num" }, duration((i.resolved_at || Date.now() / 1000) - i.since)),
        el("td", { class: "summary" }, i.summary),
        el("td", {}, reportLink(i.id))));
    fill("incidents", rows.length
      ? table(["id", "state", "severity", "kind", "where", "opened", "duration", "summary",
        "report"], rows, "grid incidents")
      : el("p", { class: "empty" }, "no incidents recorded"));
  }

  // -- polling --------------------------------------------------------------------------------

  async function histories(tables) {
    const out = new Map();
    await Promise.all(tables.map(async (t) => {
      const path = "/api/v1/tables/" + encodeURIComponent(t.target) + "/"
        + encodeURIComponent(t.name) + "/history?seconds=" + HISTORY_S;
      try {
        out.set(t.target + "/" + t.name, (await api(path)).points);
      } catch (e) {
        // History shorter than asked (a small --history) or a table just gone: no chart.
      }
    }));
    return out;
  }

  async function loadStacks(findings) {
    const wanted = findings.filter((f) => f.severity === "critical" && f.incident_id
      && !(stacksCache.get(f.incident_id) || {}).stacks);
    await Promise.all(wanted.map(async (f) => {
      try {
        stacksCache.set(f.incident_id, await api("/api/v1/incidents/" + f.incident_id));
      } catch (e) {
        // Not written yet: the next poll asks again.
      }
    }));
  }

  function showError(e) {
    const banner = document.getElementById("banner");
    banner.hidden = false;
    banner.textContent = e.status === 401
      ? "The sidecar needs a token: open this page as /#token=YOUR_TOKEN."
      : "Cannot reach the sidecar (" + e.message + "); showing data from "
        + (lastOk ? clock(lastOk) : "never") + ". Retrying…";
    const conn = document.getElementById("conn");
    conn.className = "conn stale";
    conn.textContent = "disconnected";
  }

  async function refresh() {
    const got = await Promise.all([
      api("/api/v1/targets"),
      api("/api/v1/tables"),
      api("/api/v1/probes"),
      api("/api/v1/findings"),
      api("/api/v1/incidents?limit=20"),
      api("/api/v1/memory"),
      api("/api/v1/ray"),
      api("/api/v1/fleet"),
    ]);
    const memory = got[5];
    const fleet = got[7];
    const [targets, tables, probes, findings, incidents, ray] = scoped(
      [got[0], got[1], got[2], got[3], got[4], got[6]], fleet);
    const [hist] = await Promise.all([histories(tables.tables), loadStacks(findings.findings)]);
    const now = Date.now() / 1000;
    renderJobs(fleet);
    renderFindings(findings, now);
    renderTables(tables, hist, now, memory);
    renderTargets(targets);
    renderProbes(probes);
    renderActors(probes);
    renderRay(ray);
    renderIncidents(incidents);
    lastOk = now;
    document.getElementById("banner").hidden = true;
    const conn = document.getElementById("conn");
    conn.className = "conn live";
    conn.textContent = "live · updated " + clock(now);
    document.body.dataset.updated = String(now);
  }

  async function loop() {
    try {
      await refresh();
    } catch (e) {
      showError(e);
    }
    setTimeout(loop, POLL_MS);
  }

  window.addEventListener("hashchange", takeTokenFromHash);
  takeTokenFromHash();
  loop();
})();
