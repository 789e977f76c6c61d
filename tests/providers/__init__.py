"""Provider adapters and the local stand-in (R-HTTP, R-CAT-2): real HTTP on loopback and the
official SDKs."""
