"""Simulation (SPEC section 17): traces, scenarios, and the real code run in virtual time."""
