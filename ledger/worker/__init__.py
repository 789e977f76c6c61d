"""The worker: a handler contract, the drain loop for cron, leases and their heartbeat.

`ledger.worker:echo_handler` is the documented built-in handler spec, so it is re-exported here.
"""

from ledger.worker.handler import echo_handler as echo_handler
