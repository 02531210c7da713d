"""The playground page: `GET /` and its two static files, served from the package (no build step, no CDN).

The page holds no secret: it is open without the API key, and the key a user types stays in the page's
memory and goes only into the Authorization header of its API calls. Its headers forbid framing, inline
scripts and loading anything from elsewhere.
"""

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

PAGE_DIR = Path(__file__).parent / "playground"
PAGE_FILES = {  # URL path -> (file in PAGE_DIR, media type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/playground/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
    "/playground/playground.css": ("playground.css", "text/css; charset=utf-8"),
}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def add_page_routes(app: FastAPI) -> None:
    for path, (name, media_type) in PAGE_FILES.items():
        app.add_api_route(path, _serving((PAGE_DIR / name).read_bytes(), media_type), methods=["GET", "HEAD"])


def _serving(content: bytes, media_type: str):
    async def page_file() -> Response:
        return Response(content, media_type=media_type, headers=PAGE_HEADERS)

    return page_file
