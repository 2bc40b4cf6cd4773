/* eval --html: every prediction, filterable by method, budget and correctness, each with the
   windows its method gave the sampled frames. */
(() => {
  const data = VR.readData();
  const preds = data.predictions || [];
  const app = document.getElementById("app");
  app.textContent = "";
  app.append(VR.el("h1", null, data.title || "VideoRouter evaluation"));

  const rowsSection = VR.el("section", "results");
  rowsSection.append(VR.el("h2", null, "Results"));
  const rt = VR.el("table");
  const cols = ["method", "budget", "frames", "n", "accuracy", "visual_tokens_mean", "unanswered", "failed"];
  rt.append(VR.el("tr", null, ...cols.map((c) => VR.el("th", c === "method" ? null : "num", c))));
  for (const r of data.rows || []) {
    rt.append(VR.el("tr", null, ...cols.map((c) => VR.el("td", c === "method" ? null : "num",
      typeof r[c] === "number" ? VR.fmt(r[c], c === "accuracy" || c === "visual_tokens_mean" ? 1 : undefined) : String(r[c] === null || r[c] === undefined ? "-" : r[c])))));
  }
  rowsSection.append(rt);
  if ((data.rows || []).length) app.append(rowsSection);

  const values = (k) => [...new Set(preds.map((p) => p[k]))].sort((a, b) => (a === null) - (b === null) || (a < b ? -1 : a > b ? 1 : 0));
  function select(id, label, options) {
    const sel = VR.el("select");
    sel.id = id;
    for (const [value, text] of options) {
      const o = VR.el("option", null, text);
      o.value = value;
      sel.append(o);
    }
    return [VR.el("label", null, label + " ", sel), sel];
  }
  const [mLabel, mSel] = select("f-method", "method", [["", "all"], ...values("method").map((m) => [String(m), String(m)])]);
  const [bLabel, bSel] = select("f-budget", "budget", [["", "all"], ...values("budget").map((b) => [String(b), b === null ? "none" : String(b)])]);
  const [cLabel, cSel] = select("f-correct", "answers", [["", "all"], ["right", "right"], ["wrong", "wrong"], ["failed", "failed"]]);
  const count = VR.el("span", "muted");
  count.id = "f-count";
  const filters = VR.el("section", "filters", mLabel, bLabel, cLabel, count);
  app.append(filters);

  const s = VR.el("section", "predictions");
  const table = VR.el("table");
  table.id = "predictions";
  table.append(VR.el("tr", null, ...["id", "method", "budget", "frames", "prediction", "answer", "", "tokens", "policy", "frames kept (window of each)"].map((c) => VR.el("th", null, c))));
  const trs = [];
  const labels = [];
  for (const p of preds) {
    const failed = !!p.failed;
    const mark = failed ? VR.el("span", "bad", "failed") : p.correct ? VR.el("span", "ok", "right") : VR.el("span", "bad", "wrong");
    const codes = typeof p.windows === "string" ? p.windows : "";
    for (const c of codes) labels.push(VR.codeLabel(c));
    const kept = codes ? VR.strip(codes) : VR.el("span", "muted", "not recorded");
    const tr = VR.el("tr", null, VR.el("td", null, String(p.id)), VR.el("td", null, String(p.method)),
      VR.el("td", "num", p.budget === null || p.budget === undefined ? "none" : String(p.budget)), VR.el("td", "num", VR.fmt(p.frames)),
      VR.el("td", null, String(p.prediction === null || p.prediction === undefined ? "-" : p.prediction)),
      VR.el("td", null, String(p.answer === null || p.answer === undefined ? "-" : p.answer)), VR.el("td", null, mark),
      VR.el("td", "num", VR.fmt(p.visual_tokens)), VR.el("td", null, String(p.policy || "-")), VR.el("td", null, kept));
    if (p.error) tr.title = String(p.error);
    tr.dataset.method = String(p.method);
    tr.dataset.budget = String(p.budget);
    tr.dataset.correct = failed ? "failed" : p.correct ? "right" : "wrong";
    trs.push(tr);
    table.append(tr);
  }
  s.append(VR.legend(labels), table);
  app.append(s);

  function apply() {
    let shown = 0, right = 0;
    for (const tr of trs) {
      const ok = (!mSel.value || tr.dataset.method === mSel.value) && (!bSel.value || tr.dataset.budget === bSel.value) &&
        (!cSel.value || tr.dataset.correct === cSel.value);
      tr.hidden = !ok;
      if (ok) { shown += 1; right += tr.dataset.correct === "right" ? 1 : 0; }
    }
    count.textContent = shown + " of " + trs.length + " predictions shown" + (shown ? ", " + VR.fmt(100 * right / shown, 1) + "% right" : "");
  }
  for (const sel of [mSel, bSel, cSel]) sel.addEventListener("change", apply);
  apply();
})();
