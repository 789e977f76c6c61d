"""The README and the install as written: examples run, claims checked, public paths kept."""
