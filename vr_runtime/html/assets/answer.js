/* ask --html, demo --html: one answer's page, from the JSON block beside this script. */
(() => {
  const data = VR.readData();
  const app = document.getElementById("app");
  app.textContent = "";
  const h1 = VR.el("h1", null, "What the router kept");
  if (typeof data.back === "string" && /^[\w.-]+\.html$/.test(data.back)) {
    const a = VR.el("a", null, "all questions");
    a.href = data.back;
    h1.append(" ", VR.el("span", "muted", "(", a, ")"));
  }
  app.append(h1);
  VR.renderAnswer(app, data);
})();
