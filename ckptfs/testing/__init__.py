"""Test helpers shipped with the package."""
