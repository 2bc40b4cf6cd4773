"""Fixtures of the pages' tests: the tiny runtime (for the /ui server) and the browser."""
import pytest


@pytest.fixture(scope="module")
def vr():
    from vr_runtime.runtime import VideoRouter
    return VideoRouter.from_pretrained("tiny", device="cpu", visual_cache_size=4)


@pytest.fixture(scope="module")
def browser():
    from browser_helpers import start_browser
    driver = start_browser()      # skips, with one line, where there is no Chromium
    try:
        yield driver
    finally:
        driver.quit()
