"""The monitoring page's HTML: a package data file (``templates/monitor.html``) with two slots.

``__NONCE__`` takes the per-response nonce of the Content Security Policy and ``__BOOT__`` the
initial data as JSON with ``<``, ``>``, ``&`` and line separators escaped. The page needs no
internet: inline SVG charts and vanilla JS; every value from the ledger, the broker or the
Variables is inserted as text (``textContent``), never as markup.
"""

from __future__ import annotations

import json
import secrets
from functools import lru_cache
from importlib.resources import files
from typing import Any

TEMPLATE = "monitor.html"


@lru_cache(maxsize=1)
def template() -> str:
    """The page template shipped in the package (``airflow_kafka_backpressure/plugins/templates``)."""
    return files(__package__).joinpath("templates", TEMPLATE).read_text(encoding="utf-8")


def embed_json(value: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>``, ``&`` or line separators."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def page_headers(nonce: str) -> dict[str, str]:
    csp = "; ".join(
        [
            "default-src 'none'",
            f"script-src 'nonce-{nonce}'",
            f"style-src 'nonce-{nonce}'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'self'",
        ]
    )
    return {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
    }


def render(boot: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The page with ``boot`` embedded, and its response headers (a fresh nonce each time)."""
    nonce = secrets.token_urlsafe(18)
    body = template().replace("__NONCE__", nonce).replace("__BOOT__", embed_json(boot))
    return body, page_headers(nonce)
