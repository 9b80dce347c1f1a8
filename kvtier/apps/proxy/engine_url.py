"""An engine's URL: a server's root (``http://host:port``), or one engine of a server of several
data-parallel engines (``http://host:port#dp1``), which vLLM sends a request to when its
``X-data-parallel-rank`` header names it.

    engine_url(url, side) -> str             normalized (``host:port`` gains ``http://``);
                                             ``ValueError`` naming ``side`` and what is wrong
    split(url)            -> (root, rank)    the server's root and the engine's rank (or None)
    rank_headers(url)     -> {header: rank}  what every request to that engine carries
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

RANK_HEADER = "X-data-parallel-rank"  # vLLM's: the data-parallel engine that serves a request
_RANK = re.compile(r"dp(0|[1-9][0-9]{0,3})")


def engine_url(url: str, side: str) -> str:
    """``http://host:port`` (``#dp<rank>``) for ``url``, which may lack the scheme; nothing
    else after the port."""
    full = url if "://" in url else f"http://{url}"
    parts = urlsplit(full.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{side}: {url!r} is not an http(s)://host:port URL")
    if parts.path or parts.query:
        raise ValueError(
            f"{side}: {url!r} has a path; give the engine's root, e.g. http://host:8100"
        )
    if parts.fragment and not _RANK.fullmatch(parts.fragment):
        raise ValueError(
            f"{side}: {url!r}: after '#' only the rank of one of a server's data-parallel "
            "engines, e.g. http://host:8100#dp1"
        )
    try:
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError:
        raise ValueError(f"{side}: {url!r} has a bad port") from None
    rank = f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{parts.netloc}{rank}"


def split(url: str) -> tuple[str, int | None]:
    """A normalized URL's server root and data-parallel rank (None: the server as a whole)."""
    root, _, fragment = url.partition("#")
    return root, int(fragment.removeprefix("dp")) if fragment else None


def rank_headers(url: str) -> dict[str, str]:
    """The headers that send a request to ``url``'s engine (none for a whole server)."""
    rank = split(url)[1]
    return {} if rank is None else {RANK_HEADER: str(rank)}
