"""Test helpers shared across test layers (importable as ``helpers.*``; tests/ is on sys.path)."""
