"""The broker contract suite (see conftest.py)."""
