"""The worker's public names in one place (`ledger.worker.runner`, a documented import path):
the handler contract (handler.py), stopping (stop.py), one queue item (item.py) and the drain
loop (drain.py). The attempt protocol they drive is `ledger.attempt`."""

from ledger.worker.drain import MAX_SLEEP_MS, MIN_SLEEP_MS, drain
from ledger.worker.handler import Handler, HandlerResult, Job, echo_handler, load_handler
from ledger.worker.item import run_item
from ledger.worker.stop import CallCancelled, Stopper

__all__ = [
    "MAX_SLEEP_MS",
    "MIN_SLEEP_MS",
    "CallCancelled",
    "Handler",
    "HandlerResult",
    "Job",
    "Stopper",
    "drain",
    "echo_handler",
    "load_handler",
    "run_item",
]
