"""Runs after the build: submit with the target's own tool, observe, follow, cancel, and the ledger."""
