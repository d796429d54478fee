"""Whole-project checks: the commands of the README and docs/, the notebooks, module sizes."""
