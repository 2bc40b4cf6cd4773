"""A real browser for the pages' tests: Debian's headless Chromium driven by selenium through
Debian's chromedriver. Nothing is downloaded: the browser and the driver are the system's
(``.ci/run``'s setup installs them with apt-get), selenium's own driver manager is kept offline,
and where either is missing the tests skip with one line saying what to install.

What the tests read back: the console (``browser`` log: no error may appear), the network
(``performance`` log: every request the page made, by URL), and the DOM."""
import json
import os
import pathlib
import shutil
import threading
import time

import pytest

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
INSTALL = "apt-get install chromium chromium-driver; pip install selenium"
SCREENSHOT_ENV = "VIDEOROUTER_SCREENSHOTS"      # a folder: keep each page's screenshot there


def browser_paths():
    """(chromium, chromedriver) on PATH, or a one-line reason why the browser tests skip."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, f"no selenium here; the browser tests need it: {INSTALL}"
    browser = next((shutil.which(n) for n in CHROMIUM if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        return None, f"no Chromium/chromedriver on PATH; the browser tests need them: {INSTALL}"
    return (browser, driver), None


def start_browser():
    """Headless Chromium with its console and network logged; or pytest.skip."""
    paths, why = browser_paths()
    if paths is None:
        pytest.skip(why)
    os.environ.setdefault("SE_OFFLINE", "true")       # selenium manager: never download
    os.environ.setdefault("SE_AVOID_STATS", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,900", "--disable-background-networking",
                "--disable-component-update", "--disable-default-apps", "--disable-sync",
                "--no-first-run", "--disable-extensions", "--metrics-recording-only",
                "--disable-features=Translate,OptimizationHints,MediaRouter",
                "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(paths[1]), options=opts)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver


def console_errors(driver) -> list:
    """The console's errors (and failed loads) since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def requested_urls(driver) -> list:
    """Every URL the page asked for since the last call (the DevTools network log)."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def outside(urls, allowed_prefixes) -> list:
    """The URLs that are neither data: URLs nor under one of ``allowed_prefixes``."""
    return [u for u in urls if not u.startswith("data:")
            and not any(u.startswith(p) for p in allowed_prefixes)]


def wait_for(driver, script: str, timeout: float = 60.0):
    """Poll ``script`` (JavaScript returning a value) until it is truthy; its value."""
    end = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for: {script}")
        time.sleep(0.1)


def screenshot(driver, name: str, folder: pathlib.Path) -> pathlib.Path:
    """The whole page as a small PNG (256 colours, at most 1000 px wide), in ``folder``, or in
    $VIDEOROUTER_SCREENSHOTS when set (how docs/img/ is made)."""
    from PIL import Image
    import base64
    import io
    keep = os.environ.get(SCREENSHOT_ENV)
    folder = pathlib.Path(keep) if keep else folder
    folder.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script(   # the page's content, not the empty window below it
        "const m = document.querySelector('main'); return Math.ceil(m ? "
        "m.getBoundingClientRect().bottom + window.scrollY : document.body.scrollHeight)")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": 1200, "height": min(int(height), 4000), "scale": 1}})
    img = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
    if img.width > 1000:
        img = img.resize((1000, round(img.height * 1000 / img.width)), Image.LANCZOS)
    path = folder / f"{name}.png"
    img.quantize(256).save(path, optimize=True)
    return path


def run_cli(argv) -> tuple:
    """``videorouter ARGV`` in this process -> (status, stdout, stderr): the command's own code
    without a new interpreter's imports."""
    import contextlib
    import io
    from vr_runtime import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main([str(a) for a in argv])
        except SystemExit as e:
            status = e.code
    return status, out.getvalue(), err.getvalue()


def page_thumbnails(driver) -> list:
    """(src, natural width) of each frame's thumbnail on the page, in timeline order."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#frames figure')].map(f => {"
        " const i = f.querySelector('img'); return i ? [i.src, i.naturalWidth] : [null, 0]; })")


def assert_thumbnails_are_the_frames(thumbs, video, frame_indices, num_frames, tol=4.0):
    """Each thumbnail (a data: URL) is its sampled frame: the frame decoded here again,
    resized as the vision tower gets it and shrunk the same way, within JPEG's error; and the
    frames differ from one another where the video does (not one picture everywhere)."""
    import base64
    import io
    import numpy as np
    from PIL import Image
    from vr_runtime.video.frames import open_frames
    from vr_runtime.video.sampling import Sampling
    from vr_runtime.video.thumbnails import thumbnail
    src = open_frames(str(video), Sampling(num_frames))
    ranks = [src.indices.index(int(i)) for i in frame_indices]
    with src.stream(sorted(ranks)) as s:
        frames = {r: s.take(k) for k, r in enumerate(sorted(ranks))}
    src.close()
    pixels = []
    for (url, width), r in zip(thumbs, ranks):
        assert url and url.startswith("data:image/jpeg;base64,") and width > 0, (url, width)
        img = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
                         .convert("RGB"), dtype=np.float32)
        h, w = img.shape[:2]
        want = thumbnail(frames[r], max(w, h), w / h).astype(np.float32)
        diff = float(np.abs(img - want).mean())
        assert diff < tol, f"frame {frame_indices[ranks.index(r)]}: off by {diff:.2f} on average"
        pixels.append(img)
    assert max(float(np.abs(p - pixels[0]).mean()) for p in pixels) > 5.0


class LiveServer:
    """``videorouter serve``'s app on 127.0.0.1 (a free port) in a thread of this process, with
    the tests' already-loaded model; stopped (bounded) on exit."""

    def __init__(self, app):
        import uvicorn
        from vr_runtime.serve.command import bind
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="error", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        end = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > end or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()
