"""Reports of a result: console tables, JUnit XML."""
