# Makes `tests` a package so `tests.helpers` imports from any tier and
# `tests/torch` never shadows the real `torch` on sys.path.
