"""Helpers shared by the test folders (issue 43): ledgers, backends, served processes, stand-in
homes, child processes. Tests import from here, never from another test module."""
