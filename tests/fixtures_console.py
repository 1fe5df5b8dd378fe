"""The console's browser: Debian's Chromium driven by Playwright (never a downloaded browser),
pointed only at loopback servers of the tests."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from stack.processes import free_port
from tests.fixtures_api import TenantKeys

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Module-scoped on purpose: while Playwright's sync API is open it keeps an event loop
    # running in this thread, and every async test after it would fail to start its own.
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])  # root needs it
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    yield tab
    context.close()


def sign_in(page: Page, base_url: str, tenants: TenantKeys, tenant: str, at: str = "#/") -> None:
    """Open the console and sign in with ``tenant``'s key, as a person would."""
    page.goto(f"{base_url}/console{at}")
    page.evaluate("sessionStorage.clear()")  # whoever was signed in on this origin before
    page.reload()
    page.fill("#key", tenants.keys[tenant])
    page.click("#login-form button[type=submit]")
    expect(page.locator("#who")).to_contain_text(tenant)


class Attacker:
    """Another origin on loopback: serves a page whose form posts to ``target`` on load."""

    def __init__(self) -> None:
        self.port = free_port()
        self.target = ""
        attacker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802  # http.server's name
                body = (
                    "<!doctype html><html><body>"
                    f'<form id="f" method="post" action="{attacker.target}"><input name="x" value="1"></form>'
                    "<script>document.getElementById('f').submit()</script></body></html>"
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    a = Attacker()
    yield a
    a.close()
