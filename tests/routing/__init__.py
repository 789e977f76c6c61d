"""Routing and selection (R-SEL, R-RT): globs, the pure selector, chains, pools and their CLI,
served and simulated routing."""
