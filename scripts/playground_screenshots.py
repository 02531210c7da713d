"""Screenshots of the playground page at a desktop and a phone size, for docs/.

    python scripts/playground_screenshots.py [--model smollm2-135m-instruct] [--out docs]

Starts `quickdraft serve` on the model with its default drafters, opens the page in Debian's headless
Chromium (`make browser`), sends one chat message, runs a race of the same message, and saves
OUT/playground-desktop.png (1280x1300) and OUT/playground-phone.png (390x844, the top of the page).
"""

import argparse
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

MESSAGE = "Rewrite in the past tense: I walk to the market, buy fresh bread and talk with the baker."
RACE = "List three tips for writing clear emails."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "quickdraft", "serve", "--model", args.model, "--port", str(port), "--max-batch", "4"]
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}/health", server)
        browser = chromium()
        try:
            browser.set_window_size(1280, 1300)
            browser.get(f"http://127.0.0.1:{port}/")
            wait = WebDriverWait(browser, 300)
            wait.until(lambda b: "drafter" in b.find_element(By.ID, "model-line").text)
            browser.find_element(By.ID, "prompt").send_keys(MESSAGE)
            browser.find_element(By.ID, "send").click()
            wait.until(lambda b: b.find_element(By.ID, "prompt").get_attribute("value") == "")
            browser.find_element(By.ID, "prompt").send_keys(RACE)
            browser.find_element(By.ID, "race").click()
            wait.until(lambda b: b.find_element(By.ID, "race-verdict").text)
            browser.execute_script("window.scrollTo(0, 0)")
            args.out.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(args.out / "playground-desktop.png"))
            browser.set_window_size(390, 844)
            browser.execute_script("window.scrollTo(0, 0)")
            time.sleep(0.5)
            browser.save_screenshot(str(args.out / "playground-phone.png"))
        finally:
            browser.quit()
    finally:
        server.terminate()
        server.wait(30)
    print(f"wrote {args.out / 'playground-desktop.png'} and {args.out / 'playground-phone.png'}")
    return 0


def chromium() -> webdriver.Chrome:
    options = Options()
    options.binary_location = shutil.which("chromium") or sys.exit("no chromium: run `make browser`")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_healthy(url: str, server: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server exited with {server.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    sys.exit(f"the server was not healthy after {timeout} s")


if __name__ == "__main__":
    sys.exit(main())
