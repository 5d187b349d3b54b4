"""`stratac run` in process for the end-to-end tests (tests/e2e): one spec, quiet, warmup 0."""

from stratac.tools.run import runner


def run(path, world: int, cases, *, iters: int = 2, cores: int = 4, timeout: float = 60, **kw):
    """runner.run of `path` on `world` ranks; its RunOutcome (nothing printed)."""
    spec = runner.RunSpec(file=str(path), world=world, cases=cases, iters=iters, warmup=0, cores=cores,
                          timeout=timeout, **kw)
    return runner.run(spec, echo=lambda line: None)
