"""The built-in detectors, one module per family of checkpoint layout (detectors.py runs them)."""
