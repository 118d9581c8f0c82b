"""What the tests share besides fixtures: plain functions, classes and constants, imported by test
modules (a test module never imports another one) and by tests/conftest.py's fixtures."""
