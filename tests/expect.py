"""Expectations for scenarios that run outside pytest (rank processes started as scripts, such as
tests/api/ranks.py and tests/api/buffer_ranks.py): raised, not asserted, since python -O drops
asserts. A script in a folder of tests/ imports this after putting tests/ on sys.path."""


class Failed(Exception):
    """An expectation of a scenario did not hold."""


def check(ok, what) -> None:
    if not ok:
        raise Failed(what)


def expect_error(exc_type, text, fn, *args, **kw):
    """fn(*args, **kw) raises exc_type with `text` in its message."""
    try:
        fn(*args, **kw)
    except exc_type as exc:
        check(text in str(exc), f"{text!r} not in {exc!r}")
        return
    raise Failed(f"expected {exc_type.__name__} containing {text!r}")
