"""The worker and its queue (R-Q, R-POL-4): claims, leases, recovery, spent sources."""
