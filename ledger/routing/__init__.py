"""Routing (SPEC section 18): chains, targets with an effort, pools and sticky leases.

Everything here is pure: functions of the policy, the catalog and a snapshot that take `now`.
Selection (`routing.select`) resolves chains and pool candidates through this package; the store
only reads and writes the pool cursor and the sticky lease inside the reserve (and settle) write
transaction.
"""
