"""Pure decisions and vocabulary: catalog, classification, clock, durations, policy table, tokens,
the LiteLLM converter, the policy file and the page rendering; no database, no process."""
