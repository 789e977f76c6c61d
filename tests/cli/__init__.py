"""The command line (SPEC 13): commands, status renderings, homes, hints and the demo."""
