"""The status page (R-SRV-8): the status document rendered as one HTML page."""

from ledger.page.render import SERVED_CSP, Assets, render_assets, render_page

__all__ = ["SERVED_CSP", "Assets", "render_assets", "render_page"]
