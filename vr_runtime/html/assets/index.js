/* demo --html: the index of the demo's questions, each with its answer and the windows its
   frames got. */
(() => {
  const data = VR.readData();
  const app = document.getElementById("app");
  app.textContent = "";
  app.append(VR.el("h1", null, data.title || "VideoRouter"));
  const s = VR.el("section", "pages");
  const table = VR.el("table");
  table.append(VR.el("tr", null, VR.el("th", null, "question"), VR.el("th", null, "answer"),
    VR.el("th", null, "policy"), VR.el("th", "num", "tokens / budget"), VR.el("th", null, "frames (window of each)")));
  const labels = [];
  for (const p of data.pages || []) {
    const link = VR.el("a", null, p.question || "");
    if (typeof p.href === "string" && /^[\w.-]+\.html$/.test(p.href)) link.href = p.href;
    const codes = String((p.windows || []).join(""));
    for (const c of codes) labels.push(VR.codeLabel(c));
    table.append(VR.el("tr", null, VR.el("td", null, link), VR.el("td", "answer", String(p.text || "").trim()),
      VR.el("td", null, String(p.policy || "")),
      VR.el("td", "num", VR.fmt(p.visual_tokens) + " / " + VR.fmt(p.budget)), VR.el("td", null, VR.strip(codes))));
  }
  s.append(VR.legend(labels), table);
  app.append(s);
})();
