"""The stand-in provider: a local HTTP server speaking the providers' wire formats, for the
demo, the tests and the benchmarks (it never calls a real provider)."""
