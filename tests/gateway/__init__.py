"""The gateway (R-GW) through real `ledger serve` processes and the stand-in, and its pure parts."""
