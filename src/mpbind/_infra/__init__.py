"""Private infrastructure of mpbind: library loading, wheel families, argument checks, array and
stream intake, object ownership, optional dependencies, the placement check and the ``info`` report.

Nothing here is public API: names and modules change without notice. The facades and the
distributed features import it; it never imports a feature (``tests/tooling/test_import_graph.py``).
"""
