"""The live dashboard ``agentcell serve`` answers at ``/`` (design §7.4).

A page of plain HTML, CSS and JavaScript in ``static/`` (no build step, nothing from a CDN): the hosted
sessions in a table kept live from the event stream, and one session's timeline, context breakdown and
messages, with prompt, abort and compact. It talks to the server's ordinary HTTP API with the bearer
token, which it asks for once and keeps in the tab's ``sessionStorage``; it reads Server-Sent Events with
``fetch`` (so the token travels in a header, never in a URL).

- :class:`DashboardFiles` serves the page's files (public: they hold no secret);
- :class:`SessionBoard` keeps the rows of ``GET /overview``, the one endpoint the page adds.
"""

from __future__ import annotations

from runtime.apps.dashboard.board import STREAM_TYPES, SessionBoard
from runtime.apps.dashboard.static import PAGES, DashboardFiles, read_asset

__all__ = ["PAGES", "STREAM_TYPES", "DashboardFiles", "SessionBoard", "read_asset"]
