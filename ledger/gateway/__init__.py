"""The gateway (SPEC section 19): OpenAI- and Anthropic-compatible endpoints on `ledger serve`,
so any job gets exact budgets, the error policy table and fallback by changing its base URL."""

from ledger.gateway.endpoints import router
from ledger.gateway.gate import GatewayGate, format_of

__all__ = ["GatewayGate", "format_of", "router"]
