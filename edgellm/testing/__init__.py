"""Test support shipped with the package, importable by any test, script or backend without path tricks."""
