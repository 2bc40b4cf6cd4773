/* serve's /ui: pick a video from the media directory (GET /ui/media) or upload one, ask, watch
   the answer stream, then see the timeline. It talks to POST /v1/chat/completions exactly as an
   OpenAI client does (stream: true, the video as a video_url part, the API key as a Bearer
   token), plus one opt-in field, videorouter_thumbnails: true, which adds the thumbnails of the
   frames the request decoded to the last chunk (docs/serving.md). */
(() => {
  const {el} = VR;
  const app = document.getElementById("app");
  app.textContent = "";
  app.append(el("h1", null, "VideoRouter: ask a video"));

  const form = el("form", "ask");
  form.id = "ask";
  const field = (label, input) => { form.append(el("label", null, label), input); return input; };
  const input = (type, id, attrs) => {
    const node = el(type === "textarea" ? "textarea" : type === "select" ? "select" : "input");
    if (type !== "textarea" && type !== "select") node.type = type;
    node.id = id;
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  };
  const key = field("API key", input("password", "key", {autocomplete: "off", placeholder: "only if the server was started with --api-key"}));
  const video = field("Video", input("select", "video"));
  const upload = field("or upload", input("file", "upload", {accept: "video/*,.mkv,.avi"}));
  const question = field("Question", input("textarea", "question", {placeholder: "What shape is the red object?"}));
  const frames = field("Frames", input("number", "frames", {min: "1", step: "1", placeholder: "the server's default"}));
  const policy = field("Policy", input("select", "policy"));
  for (const p of ["", "auto", "global", "fragment", "dense", "budget", "uniform"]) {
    const o = el("option", null, p || "the server's default");
    o.value = p;
    policy.append(o);
  }
  const button = el("button", null, "Ask");
  button.type = "submit";
  button.id = "submit";
  form.append(el("span"), button);
  const status = el("div", "status");
  status.id = "status";
  const stream = el("div", "stream");
  stream.id = "answer-stream";
  app.append(el("section", null, form), el("section", null, el("h2", null, "Answer"), status, stream));
  const result = el("div");
  result.id = "result";
  app.append(result);

  let limits = {};

  function headers(json) {
    const h = json ? {"Content-Type": "application/json"} : {};
    if (key.value) h.Authorization = "Bearer " + key.value;
    return h;
  }

  function say(text, error) {
    status.textContent = text;
    status.className = "status" + (error ? " error" : "");
  }

  async function errorText(resp) {
    try {
      const body = await resp.json();
      return resp.status + ": " + ((body.error && body.error.message) || JSON.stringify(body));
    } catch (e) {
      return resp.status + " " + resp.statusText;
    }
  }

  async function listVideos() {
    video.textContent = "";
    const resp = await fetch("/ui/media", {headers: headers(false), cache: "no-store"});
    if (!resp.ok) {
      say(await errorText(resp) + (resp.status === 401 ? " (enter the API key above)" : ""), true);
      return;
    }
    const body = await resp.json();
    limits = body;
    for (const v of body.videos || []) {
      const o = el("option", null, String(v.name));
      o.value = String(v.url);
      video.append(o);
    }
    if (!(body.videos || []).length) video.append(el("option", null, "(no video in the media directory)"));
    say((body.videos || []).length + " video(s) in the media directory" + (body.truncated ? " (the first " + body.videos.length + ")" : ""));
  }

  function readUpload(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).replace(/^data:;base64,/, "data:application/octet-stream;base64,"));
      reader.onerror = () => reject(new Error("cannot read " + file.name));
      reader.readAsDataURL(file);
    });
  }

  /* Tolerant JSON: the report may carry NaN (Python's json writes it), which JSON.parse refuses. */
  function parse(text) {
    try { return JSON.parse(text); } catch (e) {
      return JSON.parse(text.replace(/([:\[,]\s*)-?(NaN|Infinity)(?=\s*[,\]}])/g, "$1null"));
    }
  }

  async function readStream(resp, onChunk) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), {stream: !done});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ")) continue;
        const payload = event.slice(6);
        if (payload === "[DONE]") return;
        onChunk(parse(payload));
      }
      if (done) return;
    }
  }

  async function ask(event) {
    event.preventDefault();
    const q = question.value;
    if (!q.trim()) { say("Write a question about the video.", true); return; }
    let url = video.value;
    const file = upload.files && upload.files[0];
    if (file) {
      const cap = (limits.max_video_mb || Infinity) * 1048576;
      if (file.size > cap) { say(file.name + " is " + (file.size / 1048576).toPrecision(3) + " MiB, over the server's " + Number(limits.max_video_mb).toPrecision(3) + " MiB (--max-video-mb); pick a smaller file", true); return; }
      url = await readUpload(file);
    }
    if (!url || !/^(file|data):/.test(url)) { say("Pick a video from the list, or upload one.", true); return; }
    const body = {stream: true, videorouter_thumbnails: true, messages: [{role: "user", content: [
      {type: "video_url", video_url: {url: url}}, {type: "text", text: q}]}]};
    if (frames.value) body.num_frames = Number(frames.value);
    if (policy.value) body.policy = policy.value;
    button.disabled = true;
    stream.textContent = "";
    result.textContent = "";
    say("asking...");
    const t0 = performance.now();
    let firstToken = null, last = null, text = "", failure = null;
    try {
      const resp = await fetch("/v1/chat/completions", {method: "POST", headers: headers(true), body: JSON.stringify(body), cache: "no-store"});
      if (!resp.ok) { say(await errorText(resp), true); return; }
      await readStream(resp, (chunk) => {
        if (chunk.error) { failure = chunk.error.message || "the answer stopped early"; return; }
        const choice = (chunk.choices || [])[0];
        const piece = choice && choice.delta && choice.delta.content;
        if (piece) {
          if (firstToken === null) { firstToken = (performance.now() - t0) / 1000; say("streaming... first token after " + firstToken.toFixed(2) + " s"); }
          text += piece;
          stream.textContent = text;
        }
        if (chunk.videorouter) last = chunk;
      });
    } catch (e) {
      say("the request failed: " + e.message, true);
      return;
    } finally {
      button.disabled = false;
    }
    if (failure) { say(failure, true); return; }
    if (!last) { say("the stream ended without a report", true); return; }
    say("done in " + ((performance.now() - t0) / 1000).toFixed(2) + " s" + (firstToken === null ? "" : "; first token after " + firstToken.toFixed(2) + " s"));
    VR.renderAnswer(result, {question: q, text: text, report: last.videorouter, thumbnails: last.videorouter_thumbnails || []});
    document.body.dataset.answered = String(Number(document.body.dataset.answered || "0") + 1);
  }

  form.addEventListener("submit", (e) => { ask(e).catch((err) => { button.disabled = false; say(String(err), true); }); });
  key.addEventListener("change", () => { listVideos().catch((err) => say(String(err), true)); });
  if (VR.readData().key_required) say("This server needs its API key: enter it above to list the videos.");
  else listVideos().catch((err) => say(String(err), true));
})();
