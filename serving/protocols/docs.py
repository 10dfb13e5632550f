"""``GET /docs``: Swagger UI on ``/openapi.json``, to read the API and try it in a browser.

The page and its assets come from the Swagger UI distribution that the ``flask-swagger-ui``
package ships (no CDN: servers run offline); only the files the page loads are served,
by name. Like ``/openapi.json``, ``/docs`` is open without an API key; the calls the page
sends need one where the route does (its "Authorize" button, shown when keys are set).
URLs are relative, so the page also works behind a proxy that adds a path prefix.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from importlib.metadata import version
from importlib.resources import files

from flask import Blueprint, Response, abort

from serving.openapi import Operation
from serving.protocols.base import ProtocolSpec
from serving.protocols.schemas import ErrorResponse

__all__ = ["OPERATIONS", "PROTOCOL", "bp"]

bp = Blueprint("docs", __name__)

#: The distribution's files the page loads, and their media types.
ASSETS = {
    "swagger-ui.css": "text/css",
    "index.css": "text/css",
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui-standalone-preset.js": "text/javascript",
    "favicon-32x32.png": "image/png",
    "favicon-16x16.png": "image/png",
}

OPERATIONS = [
    Operation(
        "get",
        "/docs",
        "Swagger UI on this document: read the API and try it in a browser",
        {200: None},
        tag="probes",
        text_responses={200: "text/html"},
        security=False,
    ),
    Operation(
        "get",
        "/docs/",
        "To /docs (its relative links resolve from there)",
        {308: None},
        tag="probes",
        security=False,
        descriptions={308: "Permanent redirect to ../docs"},
    ),
    Operation(
        "get",
        "/docs/{asset}",
        "A file of the Swagger UI page (its scripts, styles and icons)",
        {200: None, 404: ErrorResponse},
        tag="probes",
        text_responses={200: tuple(sorted(set(ASSETS.values())))},  # each file's own type
        security=False,
    ),
]

PROTOCOL = ProtocolSpec(bp, OPERATIONS)

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>serving API</title>
  <meta name="swagger-ui-version" content="{version}">
  <link rel="stylesheet" href="docs/swagger-ui.css">
  <link rel="stylesheet" href="docs/index.css">
  <link rel="icon" type="image/png" href="docs/favicon-32x32.png" sizes="32x32">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/swagger-ui-bundle.js"></script>
  <script src="docs/swagger-ui-standalone-preset.js"></script>
  <script>
    window.onload = function () {{
      window.ui = SwaggerUIBundle({{
        url: "openapi.json",
        dom_id: "#swagger-ui",
        deepLinking: true,
        presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
        layout: "StandaloneLayout"
      }});
    }};
  </script>
</body>
</html>
"""


@bp.get("/docs")
def page() -> Response:
    """The Swagger UI page (text/html), loading ``/openapi.json``; it may not be framed
    (clickjacking), nor run any script but the distribution's and its own inline one."""
    html = _PAGE.format(version=version("flask-swagger-ui"))
    return Response(html, mimetype="text/html", headers=_page_headers(html))


@functools.cache
def _page_headers(html: str) -> dict[str, str]:
    """The page's security headers: a Content-Security-Policy allowing scripts from this
    origin and the page's one inline script by its SHA-256 (CSP level 2), Swagger UI's
    inline styles and data: images, requests to this origin only; no framing, no sniffing."""
    script = html.split("<script>", 1)[1].split("</script>", 1)[0]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    policy = (
        f"default-src 'self'; script-src 'self' 'sha256-{digest}'; "
        "style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": policy,
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
    }


@bp.get("/docs/")
def page_slash() -> Response:
    """308 to ``../docs``: the page's relative links would not resolve from ``/docs/``."""
    return Response(status=308, headers={"Location": "../docs"})


@bp.get("/docs/<asset>")
def asset(asset: str) -> Response:
    """One file of the distribution, by name (404 for any other name)."""
    if asset not in ASSETS:
        abort(404)
    response = Response(_read(asset), mimetype=ASSETS[asset])
    response.cache_control.max_age = 3600
    return response


@functools.cache
def _read(asset: str) -> bytes:
    """The file's bytes, read once per process (about 1.5 MB in all)."""
    return (files("flask_swagger_ui") / "dist" / asset).read_bytes()
