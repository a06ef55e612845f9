"""The crawled site: Debian's python3.11-doc (the Python 3.11 docs, PSF License), fetched with apt,
served on 127.0.0.1, parsed into passages and links, and its FAQ questions.

`ensure_site()` finds it in the cache dir, where `make crawler-site` extracts Debian's package.
`serve()` serves the HTML root at "/" (some links are root-absolute) with aiohttp.
`parse_page()` reads a Sphinx page: its title, the text passages of its main body (one per
paragraph, list item, definition, code block, heading, table cell) and the links in that body.
"""

from __future__ import annotations

import html as html_lib
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlsplit

from aiohttp import web

from bench.workloads import cache_dir

PACKAGE = "python3.11-doc"
HTML_SUBDIR = Path("usr/share/doc/python3.11/html")

# Navigation-only pages and non-page paths a focused crawler skips.
SKIP = re.compile(r"(^|/)(genindex[^/]*|search|contents|py-modindex|download)\.html$|/_[a-z]+/")

_BLOCKS = {"p", "li", "dt", "dd", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "td", "th", "caption"}
_SPACES = re.compile(r"\s+")


def ensure_site(root: Path | None = None) -> Path:
    """The HTML root of the extracted python3.11-doc package in the cache (`make crawler-site`
    downloads and extracts it; nothing is fetched from here)."""
    base = root or cache_dir("crawler", "python3.11-doc")
    html = base / HTML_SUBDIR
    if not (html / "index.html").exists():
        raise RuntimeError(
            f"the crawler workload needs Debian's {PACKAGE} extracted into {base}: run "
            "`make crawler-site` (or pass --site DIR with the extracted "
            "usr/share/doc/python3.11/html)"
        )
    return html


@dataclass(frozen=True)
class Page:
    title: str
    passages: tuple[str, ...]
    links: tuple[str, ...]  # absolute URLs, fragment removed, in document order, unique

    @property
    def text(self) -> str:
        return "\n".join((self.title, *self.passages))


class _SphinxParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.passages: list[str] = []
        self.links: list[str] = []
        self._in_title = False
        self._body_depth = 0  # div nesting inside the main body; 0 = outside
        self._skip_depth = 0  # inside script/style or a headerlink anchor
        self._pre = 0
        self._buf: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "title":
            self._in_title = True
        elif tag == "div" and self._body_depth:
            self._body_depth += 1
        elif tag == "div" and a.get("role") == "main":
            self._body_depth = 1
        if not self._body_depth:
            return
        if tag in ("script", "style") or (tag == "a" and a.get("class") == "headerlink"):
            self._skip_depth += 1
        elif tag == "a" and a.get("href"):
            self.links.append(a["href"] or "")
        if tag in _BLOCKS:
            self._flush()
        if tag == "pre":
            self._pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if not self._body_depth:
            return
        if tag in ("script", "style") or (tag == "a" and self._skip_depth):
            self._skip_depth = max(0, self._skip_depth - 1)
        if tag in _BLOCKS:
            self._flush()
        if tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag == "div":
            self._body_depth -= 1
            if not self._body_depth:
                self._flush()

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif self._body_depth and not self._skip_depth:
            self._buf.append(data)

    def _flush(self) -> None:
        raw = "".join(self._buf)
        self._buf = []
        text = raw.strip("\n") if self._pre else _SPACES.sub(" ", raw).strip()
        if text.strip():
            self.passages.append(text)


def parse_page(html: str, url: str) -> Page:
    parser = _SphinxParser()
    parser.feed(html)
    parser.close()
    title = _SPACES.sub(" ", parser.title).strip().removesuffix(" — Python 3.11.2 documentation")
    links: list[str] = []
    seen = set()
    host = urlsplit(url).netloc
    for href in parser.links:
        link = urldefrag(urljoin(url, href)).url
        parts = urlsplit(link)
        if parts.netloc != host or not parts.path.endswith(".html") or SKIP.search(parts.path):
            continue
        if link not in seen and link != url:
            seen.add(link)
            links.append(link)
    return Page(title, tuple(parser.passages), tuple(links))


def site_pages(root: Path) -> list[str]:
    """Relative paths of the site's content pages (sorted, navigation pages skipped)."""
    pages = (p.relative_to(root).as_posix() for p in root.rglob("*.html"))
    return sorted(p for p in pages if not SKIP.search("/" + p))


_QUESTION = re.compile(r"<h([2-4])>(.*?)<a class=\"headerlink\" href=\"#([^\"]+)\"", re.S)


def faq_questions(root: Path) -> list[tuple[str, str]]:
    """(page#anchor, question) for every FAQ heading that ends with '?', in site order."""
    questions = []
    for page in sorted((root / "faq").glob("*.html")):
        html = page.read_text(encoding="utf-8")
        for match in _QUESTION.finditer(html):
            text = _SPACES.sub(" ", re.sub(r"<[^>]+>", "", match.group(2))).strip()
            text = html_lib.unescape(text)
            if text.endswith("?"):
                questions.append((f"faq/{page.name}#{match.group(3)}", text))
    return questions


@asynccontextmanager
async def serve(root: Path, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve `root` at http://host:<free port>/ for the duration of the block; yields the base URL."""
    app = web.Application()
    app.router.add_static("/", root)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield f"http://{host}:{sock.getsockname()[1]}/"
    finally:
        await runner.cleanup()
        sock.close()
