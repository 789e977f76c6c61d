"""`/`, `/page.css`, `/page.js`: the status page (R-SRV-8), served under a strict CSP.

The page is the status document rendered by `ledger.page` (the same renderer as
`ledger status --html`): no second query path, no external asset, no inline script or style.
Its script refreshes it in place by fetching `/` again.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from ledger.page import SERVED_CSP, render_assets, render_page
from ledger.service.calls import ERRORS, LedgerDep
from ledger.status.document import build_status

router = APIRouter(tags=["page"], responses=ERRORS)
_HEADERS = {
    "Content-Security-Policy": SERVED_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@router.get("/", operation_id="page", response_class=HTMLResponse)
def page(ledger: LedgerDep) -> HTMLResponse:
    """The status page of this ledger (refreshed in place every few seconds by its script)."""
    state = ledger.state
    html = render_page(
        build_status(ledger),
        refresh_url="/",
        home=str(state.path),
        db_url_given=state.db_path != state.path / "ledger.db",
    )
    return HTMLResponse(html, headers=_HEADERS)


@router.get("/page.css", include_in_schema=False)
def page_css() -> Response:
    """The page's stylesheet."""
    return Response(render_assets().css, media_type="text/css", headers=_HEADERS)


@router.get("/page.js", include_in_schema=False)
def page_js() -> Response:
    """The page's script (refresh in place, local times, countdowns)."""
    return Response(render_assets().js, media_type="text/javascript", headers=_HEADERS)
