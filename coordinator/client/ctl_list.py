"""``fencingctl ls PREFIX``: the resources under a prefix, as a table or JSON (issue 29 point 4).

Owns: the ``ls`` command's arguments and help, its pages (every page by default, or one page
of ``--limit`` resources continued by ``--page-token``), and its table: one line per resource
with its holder, token, remaining TTL as a duration (``9.2s``), high-water mark and lock
waiters. Must never: show a resource the cluster did not list (the server leaves out what the
caller's principal may not use), or retry (the client does).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from coordinator.client import durations
from coordinator.client.results import ListedResource
from coordinator.client.sync import FencingClient
from coordinator.core import limits

HELP = ("resources whose names start with PREFIX (all you may use: none given), by name, with holder, "
        "token, remaining TTL, high-water mark and lock waiters")


def add_parser(command) -> None:
    """``ls``'s arguments (``command`` makes a subcommand with the common options)."""
    p = command("ls", HELP, json_form=False)
    p.add_argument("prefix", nargs="?", default="", metavar="PREFIX")
    p.add_argument(
        "--limit", metavar="N",
        help=f"one page of at most N resources (1-{limits.LIST_LIMIT_MAX}); its next page token is printed on "
             "stderr (in JSON: next_page_token). Default: every page",
    )
    p.add_argument("--page-token", dest="page_token", default="", metavar="TOKEN",
                   help="continue a listing of the same PREFIX (with --limit)")


def run(client: FencingClient, request: dict[str, Any], out: str) -> None:
    """``request``: ctl_request's, checked (prefix, limit or None for every page, page_token)."""
    prefix, limit = request["prefix"], request["limit"]
    if limit is None:
        items = list(client.list_all(prefix, page_size=limits.LIST_LIMIT_MAX))
        token = ""
    else:
        page = client.list(prefix, limit=limit, page_token=request["page_token"])
        items, token = list(page.resources), page.next_page_token
    if out == "json":
        doc: dict[str, Any] = {"prefix": prefix, "resources": [item.as_dict() for item in items]}
        if limit is not None:
            doc["next_page_token"] = token
        print(json.dumps(doc, sort_keys=True))
        return
    _print_table(items)
    if token:
        print(f"fencingctl: next page: fencingctl ls {prefix or repr('')} --limit {limit} --page-token {token}",
              file=sys.stderr)


_COLUMNS = ("RESOURCE", "HOLDER", "TOKEN", "TTL", "HWM", "WAITERS")


def _row(item: ListedResource) -> tuple[str, ...]:
    held = item.held
    return (
        item.resource,
        item.holder if held else "-",
        str(item.token) if held else "-",
        durations.text_ms(item.remaining_ms) if held else "-",
        str(item.hwm),
        str(item.waiters),
    )


def _print_table(items: list[ListedResource]) -> None:
    rows = [_row(item) for item in items]
    widths = [max([len(title), *(len(row[i]) for row in rows)]) for i, title in enumerate(_COLUMNS)]
    for row in [_COLUMNS, *rows]:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths, strict=True)).rstrip())
