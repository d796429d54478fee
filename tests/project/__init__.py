"""Whole-project checks: the README commands, the notebooks, module sizes."""
