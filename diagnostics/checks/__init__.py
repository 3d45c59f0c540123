"""Checks, one module per area; each module exports CHECKS (a tuple of Check). See diagnostics/registry.py."""
