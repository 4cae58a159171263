"""Test support shipped with the package (so any test, script or backend can import it without path tricks)."""
