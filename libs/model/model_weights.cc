// Being written (issue #2).
