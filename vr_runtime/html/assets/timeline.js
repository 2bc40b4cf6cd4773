"use strict";
/* The timeline of one answer, drawn from the JSON report that `ask --json` prints and the
   server returns (docs/CONTRACT.md section 3). Every string from outside -- the question, the
   answer, notes, file names -- reaches the page through text nodes only (el() below never
   parses markup), so a question holding <script> shows as those characters. */
const VR = (() => {
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, cls, ...children) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      node.append(typeof c === "string" || typeof c === "number" ? String(c) : c);
    }
    return node;
  }

  function sv(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function fmt(v, digits) {
    if (v === null || v === undefined || typeof v !== "number" || !isFinite(v)) return "-";
    return digits === undefined ? v.toLocaleString("en-US") : v.toFixed(digits);
  }

  /* A report window (0, s, [sh, sw]) -> its label, as `ask`'s table writes it. */
  function windowLabel(w) {
    if (w === 0 || w === null || w === undefined) return "drop";
    if (Array.isArray(w)) return w[0] + "x" + w[1];
    return w + "x" + w;
  }

  /* The pattern class of a label: full resolution, 2x2, 4x4, dropped, anything else. */
  function windowKind(label) {
    if (label === "1x1") return "full";
    if (label === "2x2" || label === "4x4" || label === "drop") return label;
    return "other";
  }

  function windowName(label) {
    return label === "1x1" ? "1x1 full" : label === "drop" ? "dropped" : label;
  }

  /* One character per frame (vr_runtime.html.window_code) -> its label. */
  function codeLabel(c) {
    if (c === "0") return "drop";
    if (/^[1-9]$/.test(c)) return c + "x" + c;
    return "other";
  }

  function swatch(kind) {
    const s = el("span", "swatch pat-" + kind);
    s.setAttribute("aria-hidden", "true");
    return s;
  }

  /* The sampled frames as rows: frame, time, score, window label, tokens. */
  function frameRows(report) {
    const idx = report.frame_indices || [];
    const times = report.frame_times_s || [];
    const scores = report.frame_scores || [];
    const windows = report.windows || [];
    const tokens = report.frame_tokens || [];
    return idx.map((f, i) => ({
      frame: f, time: times[i] === undefined ? null : times[i],
      score: scores[i] === undefined ? null : scores[i],
      window: windowLabel(windows[i]), tokens: tokens[i] === undefined ? null : tokens[i],
      relevant: Array.isArray(report.relevant) ? !!report.relevant[i] : null,
    }));
  }

  function legend(labels) {
    const box = el("div", "legend");
    const seen = [...new Set(labels)];
    const order = ["1x1", "2x2", "4x4"];
    seen.sort((a, b) => (order.indexOf(a) + 1 || 9) - (order.indexOf(b) + 1 || 9));
    for (const l of seen) box.append(el("span", null, swatch(windowKind(l)), windowName(l)));
    return box;
  }

  function meter(kind, fraction, title) {
    const m = el("div", "meter " + kind);
    const fill = el("span");
    fill.style.width = Math.max(0, Math.min(1, fraction || 0)) * 100 + "%";
    m.append(fill);
    if (title) m.title = title;
    return m;
  }

  function headerSection(data) {
    const r = data.report || {};
    const s = el("section", "qa");
    s.append(el("div", null, el("span", "label", "Question"), el("div", "question", data.question || "")));
    s.append(el("div", null, el("span", "label", "Answer"), el("div", "answer", (data.text || "").trim())));
    const p = typeof r.policy_probability === "number" ? " (p=" + fmt(r.policy_probability, 2) + ")" : "";
    const facts = el("div", "facts",
      el("span", null, "policy ", el("b", "policy", String(r.policy || "?") + p)),
      el("span", null, "model ", el("b", null, String(r.model || "?"))),
      el("span", null, "device ", el("b", null, String(r.device || "?"))),
      el("span", null, "frames ", el("b", null, fmt((r.frame_indices || []).length))),
      el("span", null, "scorer ", el("b", null, String(r.scorer || "none"))));
    s.append(facts);
    return s;
  }

  function budgetSection(report) {
    const s = el("section", "budget");
    s.append(el("h2", null, "Budget"));
    const used = report.visual_tokens || 0, budget = report.budget, dense = report.dense_visual_tokens || 0;
    const scale = Math.max(used, budget || 0, dense, 1);
    const bar = el("div", "budget-bar");
    const u = el("div", "used"); u.style.width = (used / scale) * 100 + "%"; bar.append(u);
    if (typeof budget === "number") { const b = el("div", "limit"); b.style.left = (budget / scale) * 100 + "%"; bar.append(b); }
    if (dense) { const d = el("div", "dense"); d.style.left = (dense / scale) * 100 + "%"; bar.append(d); }
    bar.setAttribute("role", "img");
    const line = typeof budget === "number"
      ? fmt(used) + " visual tokens used of budget " + fmt(budget) + " (" + fmt(100 * used / Math.max(budget, 1), 1) + "%)"
      : fmt(used) + " visual tokens (no budget: " + (report.policy || "?") + ")";
    bar.setAttribute("aria-label", line);
    s.append(el("div", "budget-line", line, el("span", "muted", "; dense: " + fmt(dense) + " tokens; text: " + fmt(report.text_tokens) + " tokens")));
    s.append(bar);
    s.append(el("div", "muted", "dark bar: tokens used; red line: the budget; dotted line: every frame at full resolution (dense)"));
    return s;
  }

  const PATTERNS = {
    full: (d) => d.append(sv("rect", {width: 6, height: 6, fill: "#a3142b"})),
    "2x2": (d) => { d.append(sv("rect", {width: 6, height: 6, fill: "#d6e4f5"})); d.append(sv("path", {d: "M-1,1 l2,-2 M0,6 l6,-6 M5,7 l2,-2", stroke: "#1f5fa8", "stroke-width": 2})); },
    "4x4": (d) => { d.append(sv("rect", {width: 6, height: 6, fill: "#eceef0"})); d.append(sv("circle", {cx: 3, cy: 3, r: 1.6, fill: "#555b63"})); },
    other: (d) => { d.append(sv("rect", {width: 6, height: 6, fill: "#f3ecc8"})); d.append(sv("rect", {width: 6, height: 2, fill: "#7a6500"})); },
  };

  function patternDefs(svg, id) {
    const defs = sv("defs");
    for (const [kind, draw] of Object.entries(PATTERNS)) {
      const p = sv("pattern", {id: id + "-" + kind.replace("x", "_"), width: 6, height: 6, patternUnits: "userSpaceOnUse"});
      draw(p);
      defs.append(p);
    }
    svg.append(defs);
  }

  /* Tokens per frame as bars (patterned by window) with the relevance score as a line. */
  function chartSection(rows) {
    const s = el("section", "chart");
    s.append(el("h2", null, "Tokens per frame and relevance"));
    const W = 1000, H = 190, L = 44, R = 40, T = 10, B = 28;
    const svg = sv("svg", {viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "tokens per sampled frame, with the Image Router's relevance score"});
    patternDefs(svg, "pt");
    const n = Math.max(rows.length, 1), maxTok = Math.max(1, ...rows.map((r) => r.tokens || 0));
    const step = (W - L - R) / n, bw = Math.max(1, step * 0.8);
    svg.append(sv("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#8a939d"}));
    svg.append(sv("text", {x: 4, y: T + 8}, fmt(maxTok)));
    svg.append(sv("text", {x: 4, y: H - B}, "0"));
    rows.forEach((r, i) => {
      const h = ((r.tokens || 0) / maxTok) * (H - T - B), x = L + i * step + (step - bw) / 2;
      const kind = windowKind(r.window);
      if (kind === "drop") {
        svg.append(sv("text", {x: x + bw / 2, y: H - B - 3, "text-anchor": "middle", class: "label"}, "x"));
      } else {
        const bar = sv("rect", {x: x, y: H - B - h, width: bw, height: Math.max(h, 0.5), fill: "url(#pt-" + kind.replace("x", "_") + ")", stroke: "#333", "stroke-width": 0.5});
        bar.append(sv("title", {}, "frame " + r.frame + ": " + windowName(r.window) + ", " + r.tokens + " tokens"));
        svg.append(bar);
      }
      if (n <= 40 || i % Math.ceil(n / 40) === 0) svg.append(sv("text", {x: x + bw / 2, y: H - 10, "text-anchor": "middle"}, r.time === null ? String(i) : fmt(r.time, 1)));
    });
    const pts = rows.map((r, i) => [L + i * step + step / 2, r.score]).filter((p) => typeof p[1] === "number");
    if (pts.length) {
      const y = (v) => T + (1 - v) * (H - T - B);
      svg.append(sv("line", {x1: L, y1: y(0.5), x2: W - R, y2: y(0.5), stroke: "#1b7f3b", "stroke-dasharray": "4 3"}));
      svg.append(sv("polyline", {points: pts.map((p) => p[0] + "," + y(p[1])).join(" "), fill: "none", stroke: "#1b7f3b", "stroke-width": 2}));
      for (const p of pts) svg.append(sv("circle", {cx: p[0], cy: y(p[1]), r: 2.5, fill: "#1b7f3b"}));
      svg.append(sv("text", {x: W - R + 4, y: y(1) + 8}, "1"));
      svg.append(sv("text", {x: W - R + 4, y: y(0.5) + 4}, "0.5"));
    }
    s.append(legend(rows.map((r) => r.window)));
    s.append(svg);
    s.append(el("div", "muted", rows.length && rows[0].time !== null ? "x: time (s); bars: tokens kept; green line: relevance score (dashed: 0.5)" : "x: sampled frame; bars: tokens kept; green line: relevance score (dashed: 0.5)"));
    return s;
  }

  function gridCells(r, report) {
    const dense = report.dense_visual_tokens || 0, n = (report.frame_indices || []).length || 1;
    const g = Math.round(Math.sqrt(dense / n)) || 16;
    const m = /^(\d+)x(\d+)$/.exec(r.window);
    if (!m) return null;
    return [Math.ceil(g / Number(m[2])), Math.ceil(g / Number(m[1]))];
  }

  function frameCard(r, thumb, report) {
    const kind = windowKind(r.window);
    const card = el("figure", "frame w-" + kind + (r.relevant ? " relevant" : ""));
    card.dataset.frame = String(r.frame);
    card.dataset.window = r.window;
    card.append(el("div", "bar pat-" + kind));
    const box = el("div", "thumb");
    if (typeof thumb === "string" && thumb.startsWith("data:image/jpeg;base64,")) {
      const img = document.createElement("img");
      img.alt = "frame " + r.frame;
      img.src = thumb;
      box.append(img);
    } else {
      box.append(el("div", "none", "no thumbnail (frames reused from the visual cache)"));
    }
    const cells = gridCells(r, report);
    if (cells && kind !== "drop") {
      const grid = el("div", "grid");
      grid.style.setProperty("--cx", String(cells[0]));
      grid.style.setProperty("--cy", String(cells[1]));
      box.append(grid);
    }
    card.append(box);
    const budget = typeof report.budget === "number" && report.budget > 0 ? report.budget : (report.visual_tokens || 1);
    const share = (r.tokens || 0) / budget;
    card.append(el("figcaption", null,
      el("div", "row", el("span", "win", swatch(kind), windowName(r.window)), el("span", "tokens", fmt(r.tokens) + " tok")),
      el("div", "row muted", el("span", null, "frame " + r.frame), el("span", null, r.time === null ? "" : fmt(r.time, 2) + " s")),
      el("div", "row", el("span", "muted", "score"), el("span", "score", r.score === null ? "-" : fmt(r.score, 3))),
      meter("score", r.score, "relevance score"),
      el("div", "row", el("span", "muted", "of budget"), el("span", "share", fmt(100 * share, 1) + "%")),
      meter("share", share, "share of the visual budget")));
    return card;
  }

  function timelineSection(rows, thumbs, report) {
    const s = el("section", "timeline");
    const kept = rows.filter((r) => r.window !== "drop").length;
    s.append(el("h2", null, "Sampled frames (" + rows.length + ", " + kept + " kept)"));
    s.append(legend(rows.map((r) => r.window)));
    const grid = el("div", "frames");
    grid.id = "frames";
    rows.forEach((r, i) => grid.append(frameCard(r, (thumbs || [])[i], report)));
    s.append(grid);
    return s;
  }

  /* The stages as bars on one time axis. The report gives durations, not start times: frames
     (opening and decoding) and vision (the tower, waiting for frames included) both start at
     the request's start and overlap; router, compress and prefill follow the tower; generate
     follows the prefill. */
  function stageSpans(t) {
    const v = (k) => (typeof t[k] === "number" && isFinite(t[k]) ? t[k] : 0);
    const visionEnd = v("vision") + v("frames_wait");
    const spans = [["frames", 0, v("frames")], ["frames_wait", 0, v("frames_wait")], ["vision", v("frames_wait"), visionEnd]];
    let at = visionEnd;
    for (const k of ["router", "compress", "prefill"]) { spans.push([k, at, at + v(k)]); at += v(k); }
    spans.push(["generate", at, at + v("generate")]);
    return spans;
  }

  function timingsSection(report) {
    const t = report.timings_s || {};
    const s = el("section", "timings");
    s.append(el("h2", null, "Stage timings"));
    const spans = stageSpans(t);
    const end = Math.max(0.001, ...spans.map((x) => x[2]), typeof t.first_token === "number" ? t.first_token : 0);
    const W = 1000, L = 90, R = 20, rowH = 20, H = spans.length * rowH + 34;
    const svg = sv("svg", {viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "stage timings on one time axis"});
    const x = (sec) => L + (sec / end) * (W - L - R);
    const fills = {frames: "#8a939d", frames_wait: "#d0d5db", vision: "#1f5fa8", router: "#1b7f3b", compress: "#7a6500", prefill: "#a3142b", generate: "#2f3a46"};
    spans.forEach(([name, a, b], i) => {
      const y = 6 + i * rowH;
      svg.append(sv("text", {x: 4, y: y + 12, class: "label"}, name));
      const bar = sv("rect", {x: x(a), y: y, width: Math.max(1, x(b) - x(a)), height: rowH - 6, fill: fills[name] || "#555"});
      bar.append(sv("title", {}, name + ": " + fmt(b - a, 3) + " s"));
      svg.append(bar);
      svg.append(sv("text", {x: Math.min(x(b) + 4, W - 60), y: y + 12}, fmt(b - a, 3) + " s"));
    });
    const axisY = spans.length * rowH + 14;
    svg.append(sv("line", {x1: L, y1: axisY - 6, x2: W - R, y2: axisY - 6, stroke: "#8a939d"}));
    svg.append(sv("text", {x: L, y: axisY + 8}, "0 s"));
    if (typeof t.first_token !== "number" || x(t.first_token) < W * 0.7 || end > t.first_token * 1.3) {
      svg.append(sv("text", {x: W - R, y: axisY + 8, "text-anchor": "end"}, fmt(end, 3) + " s"));
    }
    if (typeof t.first_token === "number") {
      const fx = x(t.first_token), right = fx > W * 0.7;
      svg.append(sv("line", {x1: fx, y1: 0, x2: fx, y2: axisY - 6, stroke: "#111", "stroke-dasharray": "3 3"}));
      svg.append(sv("text", {x: right ? fx - 4 : fx + 4, y: axisY + 8, "text-anchor": right ? "end" : "start"}, "first token " + fmt(t.first_token, 3) + " s"));
    }
    s.append(svg);
    const keys = ["frames", "frames_wait", "vision", "router", "compress", "prefill", "ttft", "first_token", "generate"];
    const table = el("table", "timing-table");
    const head = el("tr"), row = el("tr");
    for (const k of keys.concat(Object.keys(t).filter((k) => !keys.includes(k)))) {
      if (!(k in t)) continue;
      head.append(el("th", "num", k));
      row.append(el("td", "num", fmt(t[k], 3)));
    }
    table.append(head, row);
    s.append(table);
    s.append(el("div", "muted", "Seconds. frames (opening and decoding the video) overlaps vision: the tower encodes each chunk while the next decodes; frames_wait is the time it waited. Start times are laid out from the report's durations; ttft is vision + router + compress + prefill, first_token the wall time to the first token."));
    return s;
  }

  function notesSection(report) {
    const s = el("section", "notes");
    s.append(el("h2", null, "Dropped frames and notes"));
    const dropped = (report.windows || []).map((w, i) => [w, (report.frame_indices || [])[i]]).filter((p) => windowLabel(p[0]) === "drop").map((p) => p[1]);
    s.append(el("div", null, dropped.length ? dropped.length + " frame(s) dropped: " + dropped.join(", ") : "No frame dropped."));
    const notes = Array.isArray(report.notes) ? report.notes : report.notes ? [String(report.notes)] : [];
    const list = el("ul");
    for (const n of notes) list.append(el("li", null, String(n)));
    if (notes.length) s.append(list); else s.append(el("div", "muted", "No notes."));
    return s;
  }

  function rawSection(report) {
    const d = el("details", "raw");
    d.append(el("summary", null, "The JSON report"));
    const pre = el("pre", "raw", JSON.stringify(report, null, 1));
    pre.id = "report-json";
    d.append(pre);
    const s = el("section", null, d);
    return s;
  }

  /* One answer's sections, appended to `root`. */
  function renderAnswer(root, data) {
    const report = data.report || {};
    const rows = frameRows(report);
    const thumbs = Array.isArray(data.thumbnails) ? data.thumbnails : [];
    const side = thumbs.length && typeof thumbs[0] === "string" ? 150 : 130;
    root.style.setProperty("--card", side + "px");
    root.append(headerSection(data), budgetSection(report), timelineSection(rows, thumbs, report),
                chartSection(rows), timingsSection(report), notesSection(report), rawSection(report));
  }

  /* A strip: one cell per frame, from window codes ("4411044") or labels. */
  function strip(codes) {
    const box = el("div", "strip");
    for (const c of codes) {
      const label = c.length === 1 ? codeLabel(c) : c;
      const cell = el("span", "pat-" + windowKind(label));
      cell.title = windowName(label);
      box.append(cell);
    }
    box.setAttribute("role", "img");
    box.setAttribute("aria-label", codes.length + " frames");
    return box;
  }

  function readData() {
    const node = document.getElementById("vr-data");
    return node ? JSON.parse(node.textContent || "{}") : {};
  }

  return {el, sv, fmt, windowLabel, windowKind, windowName, frameRows, renderAnswer, strip, legend, swatch, readData, codeLabel};
})();
